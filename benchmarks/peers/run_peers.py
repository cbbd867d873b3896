"""milliserve against the Python serving peers on the same ONNX model, with
`milliserve bench` as the load generator. Writes the "peers" section of
docs/benchmarks.md.

    python benchmarks/peers/run_peers.py [--rounds 2] [--seconds 4]

Each peer is installed into its own venv under build/peers/venvs (created on
first use, from PyPI). All servers run at once on loopback; the bench runs them
in turn, interleaved round by round, at concurrency 1 and 8. Every server calls
ONNX Runtime with one intra-op thread; "batching on" means each server's own
dynamic batching with a 2 ms window (milliserve: its example config, 200 µs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

from report_sections import bench_level, write_section  # noqa: E402

from milliserve.examples.fraud_mlp import FEATURES, build_fraud_mlp  # noqa: E402
from milliserve.testing import ServerProcess, free_port  # noqa: E402

VENVS = ROOT / "build" / "peers" / "venvs"
PEERS = {"mlserver": ["mlserver"], "litserve": ["litserve"], "bentoml": ["bentoml"]}
ROUTE = "/v2/models/fraud_mlp/infer"


def venv(name: str) -> Path:
    """The peer's venv, created and installed on first use; returns its bin folder."""
    d = VENVS / name
    if not (d / "bin" / "python").exists():
        print(f"installing {name} into {d} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
        subprocess.run(
            [str(d / "bin" / "pip"), "install", "-q", *PEERS[name], "onnxruntime", "numpy"], check=True
        )
    return d / "bin"


def version(name: str) -> str:
    out = subprocess.run([str(venv(name) / "pip"), "show", name], capture_output=True, text=True).stdout
    return next((ln.split()[1] for ln in out.splitlines() if ln.startswith("Version:")), "?")


@contextmanager
def process(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run a server for the duration of the block; its output goes to a temporary log."""
    with tempfile.NamedTemporaryFile(prefix="peer-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_ready(port: int, body: bytes, name: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}{ROUTE}", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{name} did not answer on port {port}")


def mlserver_dir(work: Path, model: Path, batch: int, port: int) -> Path:
    d = work / f"mlserver-{batch}"
    m = d / "fraud_mlp"
    m.mkdir(parents=True)
    shutil.copy(HERE / "mlserver_runtime.py", m / "mlserver_runtime.py")
    (d / "settings.json").write_text(
        json.dumps(
            {
                "http_port": port,
                "grpc_port": free_port(),
                "metrics_port": free_port(),
                "host": "127.0.0.1",
                # MLServer 1.7's inference worker processes crash on start here
                # ("no current event loop"), so inference runs in the server process
                "parallel_workers": 0,
            }
        )
    )
    settings = {
        "name": "fraud_mlp",
        "implementation": "mlserver_runtime.OnnxFraud",
        "parameters": {"uri": str(model)},
    }
    if batch > 1:
        settings |= {"max_batch_size": batch, "max_batch_time": 0.002}
    (m / "model-settings.json").write_text(json.dumps(settings))
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=4)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ms-peers-"))
    repo = work / "repo"
    build_fraud_mlp(repo)
    model = repo / "fraud_mlp" / "1" / "model.onnx"
    nobatch = work / "repo-nobatch"
    shutil.copytree(repo, nobatch)
    cfg = (nobatch / "fraud_mlp" / "config.pbtxt").read_text()
    cfg = cfg[: cfg.index("dynamic_batching")] + cfg[cfg.index("instance_group") :]
    (nobatch / "fraud_mlp" / "config.pbtxt").write_text(cfg)
    x = np.random.default_rng(0).normal(size=(1, FEATURES)).astype(np.float32)
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "shape": [1, FEATURES],
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }
    )
    data = work / "body.json"
    data.write_text("[" + body.decode() + "]")

    targets: dict[str, int] = {}
    with ExitStack() as stack:
        for label, r in (("milliserve, batching on", repo), ("milliserve, batching off", nobatch)):
            targets[label] = stack.enter_context(ServerProcess(r)).http_port
        port = free_port()
        stack.enter_context(
            process(
                [sys.executable, str(HERE.parent / "apps" / "fastapi_baseline.py"), str(model), str(port)]
            )
        )
        targets["FastAPI + uvicorn (no batching)"] = port
        for batch in (32, 1):
            on = "on" if batch > 1 else "off"
            port = free_port()
            d = mlserver_dir(work, model, batch, port)
            stack.enter_context(process([str(venv("mlserver") / "mlserver"), "start", str(d)], cwd=d))
            targets[f"MLServer {version('mlserver')}, batching {on}"] = port
            port = free_port()
            stack.enter_context(
                process(
                    [
                        str(venv("litserve") / "python"),
                        str(HERE / "litserve_app.py"),
                        str(model),
                        str(port),
                        str(batch),
                    ],
                    cwd=HERE,
                )
            )
            targets[f"LitServe {version('litserve')}, batching {on}"] = port
            port = free_port()
            env = dict(os.environ, MODEL=str(model), MAX_BATCH=str(batch))
            stack.enter_context(
                process(
                    [
                        str(venv("bentoml") / "bentoml"),
                        "serve",
                        "bentoml_app:Fraud",
                        "--port",
                        str(port),
                        "--host",
                        "127.0.0.1",
                    ],
                    cwd=HERE,
                    env=env,
                )
            )
            targets[f"BentoML {version('bentoml')}, batching {on}"] = port
        for name, port in targets.items():
            wait_ready(port, body, name)
        results: dict[str, dict[int, list[dict]]] = {n: {1: [], 8: []} for n in targets}
        for r in range(args.rounds):
            for conc in (1, 8):
                for name, port in targets.items():  # interleaved: each target once per round
                    print(f"round {r + 1} c{conc} {name}", flush=True)
                    results[name][conc].append(
                        bench_level(
                            f"127.0.0.1:{port}",
                            "fraud_mlp",
                            work / "out.json",
                            "--data",
                            str(data),
                            "--concurrency",
                            str(conc),
                            seconds=args.seconds,
                        )
                    )

    def med(name: str, conc: int, key: str) -> float:
        vals = [
            lv["throughput"] if key == "rps" else lv["latency_us"].get(key, float("nan"))
            for lv in results[name][conc]
        ]
        return statistics.median(vals)

    lines = [
        "## Python serving peers",
        "",
        "`python benchmarks/peers/run_peers.py`: the example fraud_mlp (64→256→256→2) on every server "
        f"at once, `milliserve bench` driving each in turn ({args.rounds} interleaved rounds of "
        f"{args.seconds} s after 1 s of warmup; medians), one OIP JSON request of one row, ONNX Runtime "
        "with 1 intra-op thread everywhere. Batching on: each server's dynamic batching, 2 ms window and "
        "batch 32 for the peers, the example config for milliserve. MLServer runs with "
        "`parallel_workers: 0` (its worker processes crash at start with this Python). "
        "Client and servers share the 2 vCPUs.",
        "",
        "All the servers stay up during the run, and the idle ones still take CPU (LitServe's and "
        "BentoML's worker processes poll), so absolute numbers are higher than on a quiet machine; the "
        "comparison between rows is what this table is for.",
        "",
        "| server | c1 p50 µs | c1 p99 µs | c1 req/s | c8 p50 µs | c8 p99 µs | c8 req/s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in targets:
        errors = sum(sum(lv["errors"].values()) for c in (1, 8) for lv in results[name][c])
        lines.append(
            f"| {name} | {med(name, 1, 'p50'):,.0f} | {med(name, 1, 'p99'):,.0f} | {med(name, 1, 'rps'):,.0f}"
            f" | {med(name, 8, 'p50'):,.0f} | {med(name, 8, 'p99'):,.0f} | {med(name, 8, 'rps'):,.0f} "
            f"| {errors} |"
        )
    write_section("peers", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
