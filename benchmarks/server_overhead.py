"""Front-end overhead of milliserve against the floor (a bare protocol running the same
model: what Python reaches on this machine), the minimal FastAPI baseline, and the HTTP
stack candidates, on the example fraud_mlp. Writes docs/benchmarks.md.

    python benchmarks/server_overhead.py [--rounds 5] [--seconds 4] [--quick]

The floor: ``apps/floor.py`` (HTTP/1.1 on uvloop + httptools, ONNX Runtime called in the
parser's callback) and ``apps/grpc_floor.py`` (grpcio's sync server, one generic handler).

``milliserve (JSON, tracing on)`` is the default server exporting OpenTelemetry spans over
OTLP/HTTP (``--otlp-endpoint``, the default sampler: 1% of requests without a traceparent)
to a sink in this process that answers 200 to every export; ``tracing every request`` is
the same with ``--trace-sample-ratio 1``. ``--quick``: one round of 1 s, printed, not written.

Needs ``wrk`` (Debian package) and ``granian`` (pip) besides the test extra.
Every server runs at once; wrk drives them in turn,
interleaved round by round (A B C ... A B C ...), and the table gives the median
of the rounds. wrk shares the 2 cores with the server under test, as the servers
share them with each other's idle loops.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
import uvloop
from bench_vs_perf_analyzer import pa_level, perf_analyzer
from report_sections import commit, write_section

from milliserve.examples.fraud_mlp import FEATURES, build_fraud_mlp
from milliserve.percentiles import percentile
from milliserve.runtime.executor import InstanceWorker
from milliserve.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
URL_PATH = "/v2/models/fraud_mlp/infer"
FLOOR = "floor: bare protocol + ONNX Runtime (JSON)"
TRACED = "milliserve (JSON, tracing on)"
FLOOR_BIN = "floor: bare protocol + ONNX Runtime (binary)"
FLOOR_PA_HTTP = "floor HTTP (binary tensors)"
FLOOR_PA_GRPC = "floor gRPC (grpcio sync, generic handler)"


@dataclass
class Target:
    name: str
    port: int
    body: bytes
    headers: dict[str, str]
    path: str = URL_PATH


@dataclass
class WrkResult:
    p50_us: float
    p90_us: float
    p99_us: float
    rps: float


def _us(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]


def wrk(target: Target, connections: int, seconds: int, workdir: Path) -> WrkResult:
    slug = re.sub(r"[^a-z0-9]+", "-", target.name.lower())
    body_file = workdir / f"{slug}.body"
    body_file.write_bytes(target.body)
    script = workdir / f"{slug}.lua"
    headers = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in target.headers.items())
    script.write_text(
        f'wrk.method = "POST"\nlocal f = io.open("{body_file}", "rb")\nwrk.body = f:read("*all")\nf:close()\n'
        f"{headers}"
    )
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            f"http://127.0.0.1:{target.port}{target.path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    dist = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)\s*$", out, re.M))
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"{target.name}: errors during the run:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return WrkResult(_us(dist["50"]), _us(dist["90"]), _us(dist["99"]), rps)


def wait_http(t: Target) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{t.port}{t.path}", t.body, t.headers)
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"no server for {t.name} on port {t.port}")


def steady_level(
    pa: str, env: dict[str, str], url: str, conns: int, ms: int, out: Path, protocol: str
) -> tuple[float, float, float]:
    """A perf_analyzer level, tried again (3 times at most, with more trials) when it found no
    stable window: on these shared 2-vCPU machines it sometimes does not, for any server."""
    for attempt in range(3):
        try:
            trials = ("--max-trials", str(10 * (attempt + 1)))
            return pa_level(pa, env, url, "fraud_mlp", conns, ms, out, "-i", protocol, *trials)
        except subprocess.CalledProcessError as exc:
            failure = exc
            print(f"perf_analyzer found no stable measurement of {url} (try {attempt + 1}/3)", flush=True)
    raise RuntimeError(f"perf_analyzer could not measure {url} at concurrency {conns}") from failure


def wait_grpc(port: int) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=30)


@contextmanager
def process(cmd: list[str], cwd: Path | None = None) -> Iterator[None]:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def raw_onnxruntime(model: Path) -> dict[str, float]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(str(model), so)
    out: dict[str, float] = {}
    for batch in (1, 32):
        x = np.random.default_rng(0).normal(size=(batch, FEATURES)).astype(np.float32)
        for _ in range(200):
            s.run(None, {"features": x})
        samples = []
        for _ in range(5000):
            t0 = time.perf_counter()
            s.run(None, {"features": x})
            samples.append(time.perf_counter() - t0)
        out[f"b{batch}_p50"] = percentile(samples, 50) * 1e6
        out[f"b{batch}_p99"] = percentile(samples, 99) * 1e6
    return out


def handoff_cost(model: Path) -> dict[str, float]:
    """p50 of one fraud_mlp call made directly and through an instance worker thread."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(str(model), so)
    x = np.zeros((1, FEATURES), np.float32)

    def call() -> object:
        return s.run(None, {"features": x})

    async def measure() -> dict[str, float]:
        worker = InstanceWorker("bench")
        direct, handed = [], []
        for i in range(6000):
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            await worker.run(call)
            t2 = time.perf_counter()
            if i >= 1000:
                direct.append(t1 - t0)
                handed.append(t2 - t1)
        worker.close()
        return {"direct": percentile(direct, 50) * 1e6, "worker": percentile(handed, 50) * 1e6}

    return uvloop.run(measure())


@contextmanager
def otlp_sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint that takes every export (200) and keeps nothing: its URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def cpu_description() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s+(.*)", lscpu)
    flags = re.search(r"Flags:\s+(.*)", lscpu)
    wanted = [
        f
        for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")
        if flags and f in flags.group(1).split()
    ]
    name = model.group(1) if model else platform.processor()
    return f"{name}, {os.cpu_count()} vCPU, flags: {' '.join(wanted)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="default docs/benchmarks.md (none with --quick)")
    ap.add_argument("--quick", action="store_true", help="one round of 1 s, to check the script")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1

    work = Path(tempfile.mkdtemp(prefix="ms-bench-"))
    repo = work / "repo"
    build_fraud_mlp(repo)
    model = repo / "fraud_mlp" / "1" / "model.onnx"
    # the same model on its worker thread (inline_execution false): the default before issue 10
    worker = repo / "fraud_mlp_worker"
    (worker / "1").mkdir(parents=True)
    (worker / "1" / "model.onnx").write_bytes(model.read_bytes())
    config = (repo / "fraud_mlp" / "config.pbtxt").read_text().replace('"fraud_mlp"', '"fraud_mlp_worker"')
    config += 'parameters { key: "inline_execution" value: { string_value: "false" } }\n'
    (worker / "config.pbtxt").write_text(config)
    x = np.random.default_rng(1).normal(size=(1, FEATURES)).astype(np.float32)
    json_body = orjson.dumps(
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
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "shape": [1, FEATURES],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    )
    json_h = {"Content-Type": "application/json"}
    bin_h = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}

    print("raw onnxruntime ...", flush=True)
    raw = raw_onnxruntime(model)
    handoff = handoff_cost(model)
    targets: list[Target] = []
    levels = (1, 8, 16)
    with ExitStack() as stack:
        floor_port, floor_fixed, grpc_floor = free_port(), free_port(), free_port()
        for port, extra in ((floor_port, []), (floor_fixed, ["--fixed"])):
            stack.enter_context(
                process([sys.executable, str(APPS / "floor.py"), str(model), str(port), *extra])
            )
        targets.append(Target(FLOOR, floor_port, json_body, json_h))
        targets.append(Target(FLOOR_BIN, floor_port, header + x.tobytes(), bin_h))
        targets.append(Target("floor, protocol alone (fixed answer)", floor_fixed, json_body, json_h))
        stack.enter_context(
            process([sys.executable, str(APPS / "grpc_floor.py"), str(model), str(grpc_floor)])
        )
        ms = stack.enter_context(ServerProcess(repo))
        targets.append(Target("milliserve (JSON)", ms.http_port, json_body, json_h))
        targets.append(Target("milliserve (binary)", ms.http_port, header + x.tobytes(), bin_h))
        targets.append(
            Target(
                "milliserve (JSON, worker thread)",
                ms.http_port,
                json_body,
                json_h,
                URL_PATH.replace("fraud_mlp", "fraud_mlp_worker"),
            )
        )
        plain = stack.enter_context(ServerProcess(repo, env={**os.environ, "MILLISERVE_CPU_AFFINITY": "off"}))
        targets.append(Target("milliserve (JSON, cpu_affinity off)", plain.http_port, json_body, json_h))
        sink = stack.enter_context(otlp_sink())
        traced = stack.enter_context(ServerProcess(repo, "--otlp-endpoint", sink))
        targets.append(Target(TRACED, traced.http_port, json_body, json_h))
        every = stack.enter_context(ServerProcess(repo, "--otlp-endpoint", sink, "--trace-sample-ratio", "1"))
        targets.append(Target("milliserve (JSON, tracing every request)", every.http_port, json_body, json_h))
        base_port = free_port()
        stack.enter_context(
            process([sys.executable, str(APPS / "fastapi_baseline.py"), str(model), str(base_port)])
        )
        targets.append(Target("FastAPI + uvicorn baseline", base_port, json_body, json_h))
        probes = ["raw-uvicorn", "starlette-uvicorn", "raw-granian"]
        if importlib.util.find_spec("granian") is None:
            print("granian is not installed: no raw-granian probe in this run", flush=True)
            probes.remove("raw-granian")
        for stack_name in probes:
            port = free_port()
            stack.enter_context(
                process(
                    [sys.executable, str(APPS / "stack_probe.py"), stack_name, str(model), str(port)],
                    cwd=APPS,
                )
            )
            targets.append(Target(f"stack probe: {stack_name}", port, json_body, json_h))
        for t in targets:
            wait_http(t)
        results: dict[str, dict[int, list[WrkResult]]] = {t.name: {c: [] for c in levels} for t in targets}
        # perf_analyzer, Triton's own client, drives both protocols (wrk speaks no gRPC): the
        # default server's HTTP (binary tensors) and gRPC at the same levels, interleaved
        pa, pa_env = perf_analyzer()
        protocols = {
            "HTTP (binary tensors)": ("http", ms.http_url),
            "gRPC": ("grpc", ms.grpc_url),
            FLOOR_PA_HTTP: ("http", f"127.0.0.1:{floor_port}"),
            FLOOR_PA_GRPC: ("grpc", f"127.0.0.1:{grpc_floor}"),
        }
        wait_grpc(grpc_floor)
        pa_results: dict[str, dict[int, list[tuple[float, float, float]]]] = {
            name: {c: [] for c in levels} for name in protocols
        }
        for r in range(args.rounds):
            for conns in levels:
                for t in targets:  # interleaved: every target once per round and concurrency
                    print(f"round {r + 1}/{args.rounds} c{conns} {t.name}", flush=True)
                    results[t.name][conns].append(wrk(t, conns, args.seconds, work))
                for name, (protocol, url) in protocols.items():
                    print(f"round {r + 1}/{args.rounds} c{conns} perf_analyzer {name}", flush=True)
                    level = steady_level(
                        pa, pa_env, url, conns, int(args.seconds * 1000), work / "pa.csv", protocol
                    )
                    pa_results[name][conns].append(level)

    def med(name: str, conns: int, field: str) -> float:
        return statistics.median(getattr(w, field) for w in results[name][conns])

    base = "FastAPI + uvicorn baseline"
    lines = [
        "## Server overhead: milliserve against FastAPI, and the HTTP stack",
        "",
        f"Numbers from `python benchmarks/server_overhead.py` at commit {commit()} "
        f"({args.rounds} interleaved rounds of {args.seconds:g} s per target and concurrency; medians).",
        "",
        f"- **Machine:** {cpu_description()}; Python {platform.python_version()}, "
        f"onnxruntime {ort.__version__}.",
        "- **Threads:** every server runs ONNX Runtime with `intra_op_num_threads=1`; milliserve runs "
        "`fraud_mlp` with its example config (dynamic batching, preferred 8/16, 200 µs max delay, "
        "metrics on).",
        "- **Load generator:** `wrk -t1` on the same 2 cores as the servers (they compete for CPU). "
        "Sequential = 1 connection; throughput = 8 and 16 connections.",
        "- **Payload:** one transaction, 64 FP32 features, OIP JSON (and the binary tensor extension for "
        "milliserve (binary)).",
        "",
        "### Raw ONNX Runtime, in process (fraud_mlp, 1 thread)",
        "",
        "| batch | p50 µs | p99 µs |",
        "|---|---|---|",
        f"| 1 | {raw['b1_p50']:.1f} | {raw['b1_p99']:.1f} |",
        f"| 32 | {raw['b32_p50']:.1f} | {raw['b32_p99']:.1f} |",
        "",
        "### The thread hand-off",
        "",
        "The same fraud_mlp call, made directly and through milliserve's per-instance worker thread "
        "from a uvloop event loop (medians of 5000 alternating calls):",
        "",
        f"- direct: {handoff['direct']:.1f} µs; through the worker thread: {handoff['worker']:.1f} µs, "
        f"so the hand-off costs about {handoff['worker'] - handoff['direct']:.0f} µs here. Each direction "
        "wakes a sleeping thread on the other vCPU.",
        "",
        "### HTTP front end: milliserve against the FastAPI baseline",
        "",
        "| server | seq p50 µs | seq p90 µs | seq p99 µs | seq req/s | 8 conn req/s | 16 conn req/s "
        "| p50 vs floor | 8-conn throughput vs floor | p50 vs baseline | 8-conn throughput vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        p50 = med(t.name, 1, "p50_us")
        lines.append(
            f"| {t.name} | {p50:.0f} | {med(t.name, 1, 'p90_us'):.0f} | {med(t.name, 1, 'p99_us'):.0f} | "
            f"{med(t.name, 1, 'rps'):.0f} | {med(t.name, 8, 'rps'):.0f} | {med(t.name, 16, 'rps'):.0f} | "
            f"{p50 / med(FLOOR, 1, 'p50_us'):.2f}× | {med(t.name, 8, 'rps') / med(FLOOR, 8, 'rps'):.2f}× | "
            f"{p50 / med(base, 1, 'p50_us'):.2f}× | {med(t.name, 8, 'rps') / med(base, 8, 'rps'):.2f}× |"
        )

    def pa_med(name: str, conns: int, i: int) -> float:
        return statistics.median(level[i] for level in pa_results[name][conns])

    lines += [
        "",
        "### HTTP and gRPC with perf_analyzer (the default server, fraud_mlp)",
        "",
        "| protocol | c=1 p50 µs | c=1 p99 µs | c=1 infer/s | c=8 p50 µs | c=8 infer/s | c=16 infer/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in protocols:
        lines.append(
            f"| {name} | {pa_med(name, 1, 1) * 1000:.0f} | {pa_med(name, 1, 2) * 1000:.0f} | "
            f"{pa_med(name, 1, 0):.0f} | {pa_med(name, 8, 1) * 1000:.0f} | {pa_med(name, 8, 0):.0f} | "
            f"{pa_med(name, 16, 0):.0f} |"
        )
    grpc_p50 = pa_med("gRPC", 1, 1) / pa_med("HTTP (binary tensors)", 1, 1)
    grpc_rps = pa_med("gRPC", 8, 0) / pa_med("HTTP (binary tensors)", 8, 0)
    overhead = {
        name: med(name, 1, "p50_us") - raw["b1_p50"] for name in ("milliserve (JSON)", "milliserve (binary)")
    }
    lines += [
        "",
        f"gRPC / HTTP: p50 at c=1 {grpc_p50:.2f}× "
        f"(target ≤ 1.2×, {'met' if grpc_p50 <= 1.2 else 'not met'}), "
        f"throughput at c=8 {grpc_rps:.2f}× (target ≥ 0.8×, {'met' if grpc_rps >= 0.8 else 'not met'}); "
        'the full comparison, with MiniLM, c=16 and Triton, is the "grpc-road" section.',
        "",
        "Served p50 over raw ONNX Runtime's (wrk, 1 connection; target ≤ 100 µs, issue 23): "
        + ", ".join(
            f"{name.removeprefix('milliserve ')} {v:.0f} µs ({'met' if v <= 100 else 'not met'})"
            for name, v in overhead.items()
        )
        + ".",
    ]
    floor_rows = [
        ("HTTP JSON (wrk)", med("milliserve (JSON)", 1, "p50_us") / med(FLOOR, 1, "p50_us"),
         med("milliserve (JSON)", 8, "rps") / med(FLOOR, 8, "rps")),
        ("HTTP binary (wrk)", med("milliserve (binary)", 1, "p50_us") / med(FLOOR_BIN, 1, "p50_us"),
         med("milliserve (binary)", 8, "rps") / med(FLOOR_BIN, 8, "rps")),
        ("HTTP binary (perf_analyzer)", pa_med("HTTP (binary tensors)", 1, 1) / pa_med(FLOOR_PA_HTTP, 1, 1),
         pa_med("HTTP (binary tensors)", 8, 0) / pa_med(FLOOR_PA_HTTP, 8, 0)),
        ("gRPC (perf_analyzer)", pa_med("gRPC", 1, 1) / pa_med(FLOOR_PA_GRPC, 1, 1),
         pa_med("gRPC", 8, 0) / pa_med(FLOOR_PA_GRPC, 8, 0)),
    ]  # fmt: skip
    lines += [
        "",
        "### milliserve against the floor",
        "",
        "The floor runs the same ONNX file per request with nothing around it (`apps/floor.py`, "
        "`apps/grpc_floor.py`); milliserve runs the example config (batching, metrics, budget stages on). "
        "Goal: p50 at one connection ≤ 1.5× the floor's, requests/s at 8 connections ≥ 0.8× the floor's.",
        "",
        "| road | p50 at c=1 vs floor | throughput at c=8 vs floor |",
        "|---|---|---|",
    ]
    for road, p50_x, rps_x in floor_rows:
        lines.append(
            f"| {road} | {p50_x:.2f}× ({'met' if p50_x <= 1.5 else 'not met'}) | "
            f"{rps_x:.2f}× ({'met' if rps_x >= 0.8 else 'not met'}) |"
        )
    trace_p99 = {c: med(TRACED, c, "p99_us") / med("milliserve (JSON)", c, "p99_us") for c in levels}
    lines += [
        "",
        "Tracing on (default sampler) against off, p99: "
        + ", ".join(f"{c} connection(s) {x:.2f}×" for c, x in trace_p99.items())
        + f" (goal ≤ 1.2×: {'met' if max(trace_p99.values()) <= 1.2 else 'not met'}).",
    ]
    p50_ratio = med("milliserve (JSON)", 1, "p50_us") / med(base, 1, "p50_us")
    rps_ratio = med("milliserve (JSON)", 8, "rps") / med(base, 8, "rps")
    lines += [
        "",
        "Target (issue 10): with the default config (JSON body, batching and metrics on), "
        "milliserve's sequential p50 ≤ 1.0× the baseline's and its 8-connection throughput ≥ 1.3×. "
        f"This run: p50 {p50_ratio:.2f}× ({'met' if p50_ratio <= 1.0 else 'not met'}), "
        f"throughput {rps_ratio:.2f}× ({'met' if rps_ratio >= 1.3 else 'not met'}).",
        "",
        "### The rows",
        "",
        "- `milliserve (JSON)` / `(binary)`: the default. fraud_mlp runs in microseconds on one "
        "thread, so its batches run on the event loop thread (`inline_execution: auto`); before "
        "running, the loop yields once so that requests already read join the batch.",
        "- `worker thread`: the same model with `inline_execution: false`, every batch handed to "
        "the instance's worker thread (the default for every model before issue 10; still the "
        "default for models slower than half a thread hand-off per batch).",
        "- `cpu_affinity off`: without the default placement of the event loop (and of "
        "microsecond models' workers) on one CPU.",
        "- `tracing on`: the default server with `--otlp-endpoint` and the default sampler (a "
        "caller's traceparent decides; 1% of the requests without one are traced: a SERVER span, "
        "the model's, its stages'), exported over OTLP/HTTP to a sink that answers 200; `tracing "
        "every request`: the same with `--trace-sample-ratio 1`. Off (every other row), a request "
        "pays one branch for tracing.",
        "- The stack probes serve the same route with the model called inline and nothing else, "
        "to choose the HTTP stack by measurement; the baseline is FastAPI with pydantic models.",
        "",
    ]
    floor_p50, floor_rps = med(FLOOR, 1, "p50_us"), med(FLOOR, 8, "rps")
    headline = [  # the README's results table
        {
            "measure": "fraud_mlp over HTTP JSON, p50 at 1 connection (lower is better)",
            "milliserve": f"{med('milliserve (JSON)', 1, 'p50_us'):.0f} µs",
            "against": f"the bare floor (uvloop + httptools + ORT in one callback), {floor_p50:.0f} µs",
            "ratio": f"{floor_rows[0][1]:.2f}×",
        },
        {
            "measure": "fraud_mlp over HTTP JSON, requests/s at 8 connections (higher is better)",
            "milliserve": f"{med('milliserve (JSON)', 8, 'rps'):.0f}",
            "against": f"the bare floor, {floor_rps:.0f}",
            "ratio": f"{floor_rows[0][2]:.2f}×",
        },
        {
            "measure": "fraud_mlp over gRPC (perf_analyzer), p50 at 1 connection (lower is better)",
            "milliserve": f"{pa_med('gRPC', 1, 1) * 1000:.0f} µs",
            "against": "grpcio's sync server with a generic handler, "
            f"{pa_med(FLOOR_PA_GRPC, 1, 1) * 1000:.0f} µs",
            "ratio": f"{floor_rows[3][1]:.2f}×",
        },
    ]
    out = args.out or (None if args.quick else ROOT / "docs" / "benchmarks.md")
    if out is not None:
        write_section(
            "server-overhead",
            "\n".join(lines),
            out,
            results={
                "settings": {"run": vars(args), "levels": list(levels)},
                "rounds": args.rounds,
                # target -> connections -> each round's wrk figures; perf_analyzer's likewise
                "values": {
                    "wrk": {
                        name: {c: [vars(w) for w in ws] for c, ws in by.items()}
                        for name, by in results.items()
                    },
                    "perf_analyzer": pa_results,
                    "raw_onnxruntime": raw,
                    "handoff": handoff,
                },
                "summary": {
                    "vs_floor": {road: {"p50": p, "rps_c8": r} for road, p, r in floor_rows},
                    "tracing_p99": trace_p99,
                },
                "headline": headline,
            },
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
