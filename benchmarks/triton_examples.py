"""NVIDIA's own Python example clients, unchanged, against ``milliserve serve`` (issue 28).

    python benchmarks/triton_examples.py [--client-repo DIR] [--examples DIR] [--only NAME ...]

The examples are taken from Triton's client repository as published
(triton-inference-server/client, ``src/python/examples``): ``--examples`` names a folder
that holds them, or ``--client-repo`` a clone (a bare one is fine) from which they are
extracted with ``git archive`` into a temporary folder (never into this project). The models
they call are built by ``milliserve examples triton`` into build/triton_repository.

Each example runs as Triton's own CI runs it (qa/L0_http, qa/L0_grpc): ``python example.py``
with the server's address given through the example's own ``-u`` flag (the ports are free
ones; ``memory_growth_test.py`` has no such flag, so it needs a server on 8000/8001 and is
reported as not run when those ports are taken). An example passes when it exits 0 and,
if its source prints ``PASS``, its output says PASS. The sequence examples also run with
``-d`` (the dynamic-sequence models), as Triton's CI does. Prints one line per run and the
count; exits 1 when a run outside EXPECTED_FAILURES fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from milliserve.examples.triton import build_triton_examples
from milliserve.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLIENT_REPO = Path(
    os.environ.get("TRITON_CLIENT_REPO", "/work/.mirror/triton-inference-server+client/repo")
)
REPO = ROOT / "build" / "triton_repository"
CLIENT_VENV = ROOT / "build" / "triton-clients"
CLIENT = "2.73.0"  # the published tritonclient the examples run with (--python to choose another)

# examples this project does not serve, and why (never run)
OUT_OF_SCOPE = {
    "simple_http_cudashm_client.py": "CUDA shared memory (a GPU)",
    "simple_grpc_cudashm_client.py": "CUDA shared memory (a GPU)",
    "image_client.py": "image models (densenet_onnx, inception) and images",
    "grpc_image_client.py": "image models (densenet_onnx, inception) and images",
    "ensemble_image_client.py": "image models and an ensemble with a DALI/python preprocessor",
    "grpc_client.py": "image model densenet_onnx",
}
# runs that may fail, and why (issue 28)
EXPECTED_FAILURES = {
    "simple_http_health_metadata.py": "insists that the server is named 'triton'",
    "simple_grpc_health_metadata.py": "insists that the server is named 'triton'",
    "simple_grpc_custom_repeat.py": "needs Triton's C++ 'repeat' backend (decoupled responses)",
}
SEQUENCE_EXAMPLES = (
    "simple_http_sequence_sync_infer_client.py",
    "simple_grpc_sequence_sync_infer_client.py",
    "simple_grpc_sequence_stream_infer_client.py",
    "simple_grpc_aio_sequence_stream_infer_client.py",
)
# model control: Triton's CI serves each with a repository of the size it counts
MODEL_CONTROL = {
    "simple_http_model_control.py": 7,
    "simple_grpc_model_control.py": 8,
}


@dataclass(frozen=True)
class Run:
    script: str
    args: tuple[str, ...]
    server: str  # "main", "control7", "control8", "default_ports"

    @property
    def label(self) -> str:
        return " ".join((self.script, *self.args)).replace("{http}", "").replace("{grpc}", "").strip()


def extract(client_repo: Path, into: Path) -> Path:
    """src/python/examples of the client repository (a clone or a bare repository)."""
    bare = (client_repo / "HEAD").is_file()
    git = ["git", f"--git-dir={client_repo}"] if bare else ["git", "-C", str(client_repo)]
    what = [*git, "archive", "HEAD", "src/python/examples"]
    archive = subprocess.run(what, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src" / "python" / "examples"


def client_python(venv: Path) -> Path:
    """A Python with the published tritonclient of the examples' time, made on first use:
    the project's pinned tritonclient 2.41 imports pkg_resources for its shared-memory
    utilities, which current setuptools no longer has."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = [str(python), "-m", "pip", "show", "tritonclient"]
    shown = subprocess.run(probe, capture_output=True, text=True).stdout
    if f"Version: {CLIENT}" not in shown:
        pip = [str(python), "-m", "pip", "install", "-q", f"tritonclient[http,grpc]=={CLIENT}"]
        subprocess.run(pip, check=True)
    return python


def plan(examples: Path) -> tuple[list[Run], dict[str, str]]:
    runs: list[Run] = []
    skipped: dict[str, str] = {}
    for path in sorted(examples.glob("*.py")):
        name = path.name
        if name in OUT_OF_SCOPE:
            skipped[name] = OUT_OF_SCOPE[name]
            continue
        source = path.read_text()
        grpc = "grpc" in name and "http" not in name
        url = "{grpc}" if grpc else "{http}"
        if name == "memory_growth_test.py":
            runs += [Run(name, (), "default_ports"), Run(name, ("-i", "grpc"), "default_ports")]
        elif name == "reuse_infer_objects_client.py":
            runs += [Run(name, ("-u", "{http}"), "main"), Run(name, ("-i", "grpc", "-u", "{grpc}"), "main")]
        elif name in MODEL_CONTROL:
            runs.append(Run(name, ("-u", url), f"control{MODEL_CONTROL[name]}"))
        elif '"-u"' in source:
            runs.append(Run(name, ("-u", url), "main"))
            if name in SEQUENCE_EXAMPLES:
                runs.append(Run(name, ("-u", url, "-d"), "main"))
        else:
            skipped[name] = "takes no server address"
    return runs, skipped


def repositories(base: Path) -> dict[str, Path]:
    """The main repository (every model) and the model-control ones (7 and 8 models)."""
    build_triton_examples(base / "all")
    out = {"main": base / "all", "default_ports": base / "all", "control8": base / "all"}
    seven = base / "seven"
    if seven.exists():
        shutil.rmtree(seven)
    seven.mkdir()
    for model in sorted(p.name for p in (base / "all").iterdir() if p.name != "custom_identity_int32"):
        shutil.copytree(base / "all" / model, seven / model)
    out["control7"] = seven
    return out


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_for(kind: str, repo: Path) -> ServerProcess:
    if kind.startswith("control"):
        return ServerProcess(repo, "--model-control-mode", "explicit")
    proc = ServerProcess(repo, "--shared-memory", "system")
    if kind == "default_ports":
        proc.http_port, proc.grpc_port = 8000, 8001
    return proc


def run_one(
    python: Path, run: Run, examples: Path, server: ServerProcess, timeout_s: float
) -> tuple[bool, str]:
    args = [a.replace("{http}", server.http_url).replace("{grpc}", server.grpc_url) for a in run.args]
    try:
        r = subprocess.run(
            [str(python), str(examples / run.script), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=examples,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout_s:g} s"
    out = r.stdout + r.stderr
    wants_pass = "PASS" in (examples / run.script).read_text()
    ok = r.returncode == 0 and (not wants_pass or "PASS" in r.stdout)
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    return ok, tail if not ok else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client-repo", type=Path, default=DEFAULT_CLIENT_REPO)
    p.add_argument("--examples", type=Path, help="a folder holding the examples (else extracted)")
    p.add_argument("--only", action="append", help="run only these example files (repeatable)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per example run")
    p.add_argument(
        "--python",
        type=Path,
        help=f"the Python that runs the examples (default: {CLIENT_VENV.relative_to(ROOT)}, "
        f"made on first use with tritonclient {CLIENT})",
    )
    args = p.parse_args()
    python = args.python or client_python(CLIENT_VENV)
    with ExitStack() as stack:
        examples = args.examples
        if examples is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="triton-examples-")))
            examples = extract(args.client_repo, tmp)
        runs, skipped = plan(examples)
        if args.only:
            runs = [r for r in runs if r.script in args.only]
        repos = repositories(REPO)
        results: list[tuple[Run, bool, str]] = []
        for kind in dict.fromkeys(r.server for r in runs):
            mine = [r for r in runs if r.server == kind]
            if kind == "default_ports" and not (port_free(8000) and port_free(8001)):
                results += [(r, False, "not run: ports 8000/8001 are taken") for r in mine]
                continue
            with server_for(kind, repos[kind]) as server:
                for run in mine:
                    t0 = time.monotonic()
                    ok, why = run_one(python, run, examples, server, args.timeout)
                    results.append((run, ok, why))
                    mark = "PASS" if ok else "FAIL"
                    print(f"{mark}  {run.label:<58} {time.monotonic() - t0:5.1f}s  {why}", flush=True)
    passed = sum(ok for _, ok, _ in results)
    print(f"\n{passed} of {len(results)} runs pass")
    for run, ok, _ in results:
        if not ok and run.script in EXPECTED_FAILURES:
            print(f"  expected: {run.label}: {EXPECTED_FAILURES[run.script]}")
    for name, why in skipped.items():
        print(f"  not run: {name}: {why}")
    unexpected = [r for r, ok, _ in results if not ok and r.script not in EXPECTED_FAILURES]
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
