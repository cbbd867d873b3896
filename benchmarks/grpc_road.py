"""gRPC against HTTP on one server, with Triton's own client (perf_analyzer) for both
protocols (issue 23), the two gRPC stacks side by side (milliserve's own HTTP/2 listener,
the default, and grpc.aio, ``MILLISERVE_GRPC__STACK=grpcio``, the stack before issue 23),
and Triton itself (tritonserver 2.51 through nvidia-pytriton, fraud_mlp in its Python
backend) with and without its dynamic batcher. Writes the "grpc-road" section of
docs/benchmarks.md.

    python benchmarks/grpc_road.py [--rounds 5] [--seconds 1.5] [--no-triton]

The servers run the example fraud_mlp and minilm (Triton: fraud_mlp only); perf_analyzer
drives one (server, protocol) pair at a time, interleaved round by round (every variant
once per round, model and concurrency). PyTriton is installed into build/peers/venvs/pytriton
on first use, pinned (peers/peer_settings.py). Run it alone: it measures CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench_vs_perf_analyzer import pa_level, perf_analyzer
from peers import peer_settings
from report_sections import commit, write_section
from server_overhead import cpu_description

from milliserve.examples.build import build_examples
from milliserve.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "fraud_mlp": (),
    # 32 zero token ids: the same work on every call, and valid ids for the embedding table
    "minilm": ("--shape", "input_ids:32", "--shape", "attention_mask:32", "--input-data", "zero"),
}
LEVELS = (1, 8, 16)


@dataclass(frozen=True)
class Variant:
    name: str
    server: str  # which server
    protocol: str  # perf_analyzer -i


VARIANTS = (
    Variant("HTTP (binary tensors)", "native", "http"),
    Variant("gRPC, milliserve's HTTP/2", "native", "grpc"),
    Variant("gRPC, grpc.aio", "grpcio", "grpc"),
)
TRITON = (
    Variant("Triton, Python backend + batcher, HTTP", "triton", "http"),
    Variant("Triton, Python backend + batcher, gRPC", "triton", "grpc"),
    Variant("Triton, Python backend, no batcher, HTTP", "triton-nb", "http"),
    Variant("Triton, Python backend, no batcher, gRPC", "triton-nb", "grpc"),
)
PYTRITON_VENV = ROOT / "build" / "peers" / "venvs" / "pytriton"


@dataclass(frozen=True)
class Ports:
    http_url: str
    grpc_url: str


def pytriton_python() -> Path:
    py = PYTRITON_VENV / "bin" / "python"
    if not py.exists():
        print(f"installing nvidia-pytriton into {PYTRITON_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PYTRITON_VENV)], check=True)
        subprocess.run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "-q",
                *peer_settings.pin("nvidia-pytriton", "onnxruntime"),
                "numpy",
            ],
            check=True,
        )
    return py


@contextmanager
def triton(model: Path, batcher: bool) -> Iterator[Ports]:
    """tritonserver through PyTriton; its libpython comes first on LD_LIBRARY_PATH
    (shared/TRITON-PEER-NOTES.md). Ready when the model is."""
    py = pytriton_python()
    libdir = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip() or str(sysconfig.get_config_var("LIBDIR"))
    env = {**os.environ, "LD_LIBRARY_PATH": libdir + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")}
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    app = ROOT / "benchmarks" / "apps" / "pytriton_fraud.py"
    cmd = [str(py), str(app), str(model), "--http-port", str(http), "--grpc-port", str(grpc_port)]
    cmd += ["--metrics-port", str(metrics)] + ([] if batcher else ["--no-batcher"])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/fraud_mlp/ready", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Triton, Python backend (PyTriton) did not start") from None
                time.sleep(0.5)
        yield Ports(f"127.0.0.1:{http}", f"127.0.0.1:{grpc_port}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}–{max(values):,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--no-triton", action="store_true", help="leave Triton (Python backend, PyTriton) out")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--quick", action="store_true", help="one short round to check the script; no report")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1.0
    pa, env = perf_analyzer()
    work = Path(tempfile.mkdtemp(prefix="ms-grpc-road-"))
    repo = work / "repo"
    build_examples(repo, only=list(MODELS))
    ms = int(args.seconds * 1000)
    results: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    env_grpcio = {**os.environ, "MILLISERVE_GRPC__STACK": "grpcio"}
    variants = {m: VARIANTS + (TRITON if m == "fraud_mlp" and not args.no_triton else ()) for m in MODELS}
    with ExitStack() as stack:
        servers: dict[str, ServerProcess | Ports] = {
            "native": stack.enter_context(ServerProcess(repo)),
            "grpcio": stack.enter_context(ServerProcess(repo, env=env_grpcio)),
        }
        if not args.no_triton:
            onnx = repo / "fraud_mlp" / "1" / "model.onnx"
            servers["triton"] = stack.enter_context(triton(onnx, batcher=True))
            servers["triton-nb"] = stack.enter_context(triton(onnx, batcher=False))

        def url(v: Variant) -> str:
            s = servers[v.server]
            return s.http_url if v.protocol == "http" else s.grpc_url

        for model, extra in MODELS.items():  # warm every road once
            for v in variants[model]:
                pa_level(pa, env, url(v), model, 8, 1000, work / "warm.csv", "-i", v.protocol, *extra)
        for r in range(args.rounds):
            for model, extra in MODELS.items():
                for level in LEVELS:
                    for v in variants[model]:
                        print(f"round {r + 1}/{args.rounds} {model} c{level} {v.name}", flush=True)
                        out = work / "pa.csv"
                        got = pa_level(pa, env, url(v), model, level, ms, out, "-i", v.protocol, *extra)
                        results.setdefault((model, v.name, level), []).append(got)
        measured_at = commit()

    def med(model: str, name: str, level: int, i: int) -> float:
        return statistics.median(x[i] for x in results[(model, name, level)])

    lines = [
        "## gRPC against HTTP, and the two gRPC stacks (perf_analyzer)",
        "",
        f"Numbers from `python benchmarks/grpc_road.py` at commit `{measured_at}`: {args.rounds} interleaved "
        f"rounds (every variant once per round, model and concurrency) of perf_analyzer 2.41 "
        f"(`-p {ms} -s 50`, its stability windows); medians, with the spread over the rounds.",
        "",
        f"- **Machine:** {cpu_description()}; Python {platform.python_version()}. perf_analyzer shares "
        "the 2 vCPUs with the server.",
        "- **Servers:** two `milliserve serve` of the example repository, up together; one serves gRPC "
        "with milliserve's own HTTP/2 listener (the default), the other with grpc.aio "
        "(`MILLISERVE_GRPC__STACK=grpcio`, the stack before issue 23). HTTP rows are the first "
        "server's. Example configs: fraud_mlp dynamic batching (preferred 8/16, 200 µs), 1 "
        "intra-op thread; minilm FP32, batching (preferred 4/8, 2 ms), 2 intra-op threads, 32 tokens.",
        "- **Client:** perf_analyzer, `-i http` (binary tensor extension) or `-i grpc`, one "
        "connection (it multiplexes a gRPC channel; HTTP uses one connection per concurrent request).",
        "- **Triton, Python backend:** tritonserver 2.51 (C++ HTTP/gRPC front ends and scheduler) "
        "through nvidia-pytriton 0.7.0, fraud_mlp in ONNX Runtime (1 thread) called from Python in "
        "Triton's **Python backend** (each batch crosses to PyTriton's process over shared memory): "
        "not Triton's C++ ONNX Runtime backend, which the wheel does not have and which would "
        "skip that hop. With its dynamic batcher (200 µs, preferred 8/16, as milliserve's example) "
        "and without; up beside the other servers. Not run for minilm.",
        "",
        "| model | variant | c | infer/s | spread | p50 µs | p99 µs | vs HTTP infer/s | vs HTTP p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for level in LEVELS:
            http = VARIANTS[0].name
            for v in variants[model]:
                rows = results[(model, v.name, level)]
                rps, p50, p99 = (med(model, v.name, level, i) for i in range(3))
                lines.append(
                    f"| {model} | {v.name} | {level} | {rps:,.0f} | {spread([x[0] for x in rows])} | "
                    f"{p50 * 1000:.0f} | {p99 * 1000:.0f} | {rps / med(model, http, level, 0):.2f}× | "
                    f"{p50 / med(model, http, level, 1):.2f}× |"
                )
    native = VARIANTS[1].name
    checks = []
    for model in MODELS:
        p50_ratio = med(model, native, 1, 1) / med(model, VARIANTS[0].name, 1, 1)
        thr = [med(model, native, c, 0) / med(model, VARIANTS[0].name, c, 0) for c in (8, 16)]
        checks.append(
            f"{model}: gRPC p50 at c=1 {p50_ratio:.2f}× HTTP's ({'met' if p50_ratio <= 1.2 else 'not met'}); "
            f"throughput at c=8 and 16 {thr[0]:.2f}× and {thr[1]:.2f}× "
            f"({'met' if min(thr) >= 0.8 else 'not met'})"
        )
    lines += [
        "",
        "Targets (issue 23): gRPC p50 ≤ 1.2× HTTP binary at concurrency 1, gRPC throughput ≥ 0.8× "
        "HTTP's at 8 and 16. This run: " + "; ".join(checks) + ".",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        write_section(
            "grpc-road",
            text,
            args.out,
            results={
                "settings": {"run": vars(args)},
                "rounds": args.rounds,
                # (model, variant, concurrency) -> each round's (infer/s, p50 ms, p99 ms)
                "values": results,
                "summary": {"checks": checks},
                "peers": {"tritonclient": None, "nvidia-pytriton": None},
            },
        )


if __name__ == "__main__":
    main()
