"""milliserve against the Python serving peers on the same ONNX model, with
`milliserve bench` as the load generator. Writes the "peers" section of
docs/benchmarks.md.

    python benchmarks/peers/run_peers.py [--rounds 3] [--seconds 4]
    python benchmarks/peers/run_peers.py --quick   # milliserve and FastAPI only; no doc

Each peer is installed into its own venv under build/peers/venvs (created on
first use, from PyPI, at the versions pinned in peer_settings.VERSIONS). One server is up
at a time on loopback (an idle server still takes CPU: LitServe's and BentoML's workers
poll): each round starts each server in turn, measures it at concurrency 1 and 8, and
stops it; the order rotates round by round. Every server calls ONNX Runtime with one
intra-op thread; "batching on" means each server's own dynamic batching, set up as its
docs recommend for low latency, with the same 2 ms window and batch of 32 where the peer
has a window setting (milliserve: its example config; BentoML: its latency target
instead; LitServe with its fast_queue transport). peer_settings.py holds every setting
and why, and the section prints them.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

import peer_settings  # noqa: E402
from report_sections import bench_level, commit, write_section  # noqa: E402
from server_overhead import cpu_description  # noqa: E402

from milliserve.examples.fraud_mlp import FEATURES, build_fraud_mlp  # noqa: E402
from milliserve.testing import ServerProcess, free_port  # noqa: E402

VENVS = ROOT / "build" / "peers" / "venvs"
# what each peer's venv holds, pinned (peer_settings.VERSIONS)
PEERS = {
    "mlserver": peer_settings.pin("mlserver", "onnxruntime"),
    "litserve": peer_settings.pin("litserve", "pyzmq", "onnxruntime"),
    "bentoml": peer_settings.pin("bentoml", "onnxruntime"),
}
ROUTE = "/v2/models/fraud_mlp/infer"


def venv(name: str) -> Path:
    """The peer's venv, created and installed on first use; returns its bin folder."""
    d = VENVS / name
    if not (d / "bin" / "python").exists():
        print(f"installing {name} into {d} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
        subprocess.run([str(d / "bin" / "pip"), "install", "-q", *PEERS[name], "numpy"], check=True)
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
    d = work / f"mlserver-{batch}-{port}"
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
                "parallel_workers": int(peer_settings.MLSERVER["parallel_workers"][0]),
            }
        )
    )
    settings: dict[str, object] = {
        "name": "fraud_mlp",
        "implementation": "mlserver_runtime.OnnxFraud",
        "parameters": {"uri": str(model)},
    }
    if batch > 1:
        ml = peer_settings.MLSERVER
        settings |= {
            "max_batch_size": int(ml["max_batch_size"][0]),
            "max_batch_time": float(ml["max_batch_time"][0]),
        }
    (m / "model-settings.json").write_text(json.dumps(settings))
    return d


@contextmanager
def _milliserve(repo: Path, port: int) -> Iterator[None]:
    """``milliserve serve repo`` with its HTTP port at ``port``."""
    srv = ServerProcess(repo)
    srv.http_port = port
    with srv:
        yield


@contextmanager
def _mlserver(work: Path, model: Path, batch: int, port: int) -> Iterator[None]:
    d = mlserver_dir(work, model, batch, port)
    with process([str(venv("mlserver") / "mlserver"), "start", str(d)], cwd=d):
        yield


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument(
        "--quick", action="store_true", help="milliserve and FastAPI only, one short round; printed, no doc"
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1
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

    # each target: how to start it on a free port (a context manager), and its name
    targets: dict[str, Callable[[int], Any]] = {
        "milliserve, batching on": lambda port: _milliserve(repo, port),
        "milliserve, batching off": lambda port: _milliserve(nobatch, port),
        "FastAPI + uvicorn (no batching)": lambda port: process(
            [sys.executable, str(HERE.parent / "apps" / "fastapi_baseline.py"), str(model), str(port)]
        ),
    }
    lit, bento = peer_settings.LITSERVE, peer_settings.BENTOML
    for batch in () if args.quick else (32, 1):
        on = "on" if batch > 1 else "off"
        targets[f"MLServer {version('mlserver')}, batching {on}"] = lambda port, b=batch: _mlserver(
            work, model, b, port
        )
        for w in peer_settings.WORKERS_SWEPT:  # one worker (as every peer) and one per core
            many = "" if w == 1 else f", {w} workers"
            targets[f"LitServe {version('litserve')}, batching {on}{many}"] = lambda port, b=batch, w=w: (
                process(
                    [
                        str(venv("litserve") / "python"),
                        str(HERE / "litserve_app.py"),
                        str(model),
                        str(port),
                        str(b),
                        lit["batch_timeout"][0],
                        lit["fast_queue"][0],
                        str(w),
                    ],
                    cwd=HERE,
                )
            )
            env = dict(
                os.environ,
                MODEL=str(model),
                MAX_BATCH=str(batch),
                MAX_LATENCY_MS=bento["max_latency_ms"][0],
                WORKERS=str(w),
            )
            targets[f"BentoML {version('bentoml')}, batching {on}{many}"] = lambda port, e=env: process(
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
                env=e,
            )
    names = list(targets)
    results: dict[str, dict[int, list[dict]]] = {n: {1: [], 8: []} for n in targets}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # the order rotates
            port = free_port()
            with targets[name](port):  # one server up at a time
                wait_ready(port, body, name)
                for conc in (1, 8):
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
        f"`python benchmarks/peers/run_peers.py --rounds {args.rounds} --seconds {args.seconds}` at commit "
        f"{commit()} ({cpu_description()}): the "
        "example fraud_mlp (64→256→256→2) on each server, one server up at a time, `milliserve bench` "
        f"driving it ({args.rounds} rounds, the servers' order rotating, {args.seconds} s per level after "
        "1 s of warmup; medians), one OIP JSON request of one row. Client and server share the 2 vCPUs. "
        "Every setting, and why:",
        "",
        *peer_settings.lines(),
        "",
        "| server | c1 p50 µs | c1 p99 µs | c1 req/s | c8 p50 µs | c8 p99 µs | c8 req/s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        errors = sum(sum(lv["errors"].values()) for c in (1, 8) for lv in results[name][c])
        lines.append(
            f"| {name} | {med(name, 1, 'p50'):,.0f} | {med(name, 1, 'p99'):,.0f} | {med(name, 1, 'rps'):,.0f}"
            f" | {med(name, 8, 'p50'):,.0f} | {med(name, 8, 'p99'):,.0f} | {med(name, 8, 'rps'):,.0f} "
            f"| {errors} |"
        )
    print("\n".join(lines))
    # the README's results table: milliserve (batching on, its default) against the peer with
    # the most req/s at 8 connections, on that and on p50 at one connection
    ours = "milliserve, batching on"
    peers = [n for n in names if not n.startswith("milliserve")]
    best = max(peers, key=lambda n: med(n, 8, "rps"))
    headline = [
        {
            "measure": "fraud_mlp req/s at 8 connections, OIP JSON",
            "milliserve": f"{med(ours, 8, 'rps'):,.0f}",
            "against": f"{best} (the peer with the most), {med(best, 8, 'rps'):,.0f}",
            "ratio": f"{med(ours, 8, 'rps') / med(best, 8, 'rps'):.2f}×",
        },
        {
            "measure": "fraud_mlp p50 at 1 connection, OIP JSON (lower is better)",
            "milliserve": f"{med(ours, 1, 'p50'):,.0f} µs",
            "against": f"{best}, {med(best, 1, 'p50'):,.0f} µs",
            "ratio": f"{med(ours, 1, 'p50') / med(best, 1, 'p50'):.2f}×",
        },
    ]
    if not args.quick:
        write_section(
            "peers",
            "\n".join(lines),
            results={
                "settings": {
                    "run": vars(args),
                    "every server": peer_settings.EVERYONE,
                    "MLServer": peer_settings.MLSERVER,
                    "LitServe": peer_settings.LITSERVE,
                    "BentoML": peer_settings.BENTOML,
                    "milliserve": peer_settings.MILLISERVE,
                    "workers swept": peer_settings.WORKERS_SWEPT,
                },
                "rounds": args.rounds,
                "headline": headline,
                "values": results,  # server -> concurrency -> its `milliserve bench` level per round
            },
        )


if __name__ == "__main__":
    main()
