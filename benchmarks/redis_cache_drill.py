"""Redis response cache drill (issue 10): hit ratio with a healthy and with a busy Redis,
then Redis killed and restarted on the same port under load.

    python benchmarks/redis_cache_drill.py [--requests 3000] [--down-s 2]
    ../shared/tools/under-load python benchmarks/redis_cache_drill.py   # two CPU burners

One server (``add_sub`` with ``response_cache { enable: true backend: "redis" }``, the
default Redis settings: 50 ms per call, 5 failures within 1 s open the breaker for 1 s)
and one redis-server, both on loopback; 4 client threads send 50 distinct inputs
round-robin over HTTP/JSON the whole time. Phases:

1. healthy: the hit ratio over ``--requests`` requests (server statistics);
2. busy: the same while another client holds Redis for ``--stall-ms`` every
   ``--stall-every-ms`` (DEBUG SLEEP), as a neighbour's slow command would;
3. outage: Redis stopped for ``--down-s``, then restarted on the same port (empty): the
   requests that failed from the kill until hits came back, and the seconds from the
   restart to the first hit (target: 2 s).

Prints the figures; writes nothing. This is the scenario of
tests/e2e/test_redis_breaker.py, measured instead of asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

import httpx
import numpy as np
import onnx
import redis
from onnx import TensorProto, helper

from milliserve.testing import RedisServer, ServerProcess

CONFIG = 'name: "add_sub"\nmax_batch_size: 8\nresponse_cache { enable: true backend: "redis" ttl_s: 300 }\n'


def write_add_sub(repo: Path) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32 [batch, n])."""
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "n"]) for n in ("INPUT0", "INPUT1")]
    outs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "n"]) for n in ("OUTPUT0", "OUTPUT1")
    ]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "add_sub", io, outs))
    model.opset_import[0].version = 17
    model.ir_version = 8
    (repo / "add_sub" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "add_sub" / "1" / "model.onnx"))
    (repo / "add_sub" / "config.pbtxt").write_text(CONFIG)


class Load:
    """Client threads sending ``inputs`` round-robin until stopped; counts and latencies."""

    def __init__(self, http_url: str, threads: int, inputs: int) -> None:
        self.url = f"http://{http_url}/v2/models/add_sub/infer"
        self.inputs = [np.array([i, i + 0.5, -i, 1.0], dtype=np.float32) for i in range(inputs)]
        self.sent = self.failed = self.wrong = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(t * 13,)) for t in range(threads)]

    def _send(self, offset: int) -> None:
        with httpx.Client(timeout=30) as client:
            i = offset
            while not self._stop.is_set():
                x = self.inputs[i % len(self.inputs)]
                i += 1
                tensor = {"datatype": "FP32", "shape": [1, 4], "data": x.tolist()}
                body = {"inputs": [{"name": n, **tensor} for n in ("INPUT0", "INPUT1")]}
                error, wrong = "", False
                t0 = time.perf_counter()
                try:
                    r = client.post(self.url, json=body)
                    if r.status_code != 200:
                        error = f"HTTP {r.status_code}: {r.text[:200]}"
                    else:
                        out = next(o for o in r.json()["outputs"] if o["name"] == "OUTPUT0")
                        wrong = out["data"] != (2 * x).tolist()
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                elapsed = time.perf_counter() - t0
                with self._lock:
                    self.sent += 1
                    self.wrong += wrong
                    self.latencies.append(elapsed)
                    if error:
                        self.failed += 1
                        if len(self.errors) < 5:
                            self.errors.append(error)

    def wait_sent(self, n: int, timeout_s: float = 600) -> None:
        t0 = time.monotonic()
        while self.sent < n:
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"only {self.sent} of {n} requests sent in {timeout_s} s")
            time.sleep(0.01)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


class Stalls:
    """Another client's DEBUG SLEEP of ``stall_s`` every ``every_s``: a busy Redis."""

    def __init__(self, url: str, stall_s: float, every_s: float) -> None:
        self.client = redis.Redis.from_url(url)
        self.stall_s, self.every_s = stall_s, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.client.execute_command("DEBUG", "SLEEP", str(self.stall_s))

    def __enter__(self) -> Stalls:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


def cache_counts(http_url: str) -> tuple[int, int]:
    stats = httpx.get(f"http://{http_url}/v2/models/add_sub/stats").json()
    s = stats["model_stats"][0]["inference_stats"]
    return int(s["cache_hit"]["count"]), int(s["cache_miss"]["count"])


def measure(load: Load, http_url: str, requests: int, label: str) -> float:
    """Run ``requests`` more requests; print and return the hit ratio over them."""
    h0, m0 = cache_counts(http_url)
    n0, lat0, t0 = load.sent, len(load.latencies), time.perf_counter()
    load.wait_sent(n0 + requests)
    h1, m1 = cache_counts(http_url)
    elapsed = time.perf_counter() - t0
    ratio = (h1 - h0) / max(1, (h1 - h0) + (m1 - m0))
    lat = sorted(load.latencies[lat0:])
    p50, p99 = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    print(
        f"{label:8s} hit ratio {ratio:.3f} ({h1 - h0} hits, {m1 - m0} misses); "
        f"{(load.sent - n0) / elapsed:.0f} req/s, p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
    )
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000, help="per hit-ratio phase")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--inputs", type=int, default=50)
    ap.add_argument("--stall-ms", type=float, default=10.0)
    ap.add_argument("--stall-every-ms", type=float, default=100.0)
    ap.add_argument("--down-s", type=float, default=2.0)
    ap.add_argument("--resume-timeout-s", type=float, default=30.0)
    args = ap.parse_args()
    print(f"{os.cpu_count()} vCPU, load average {os.getloadavg()[0]:.2f} at start")
    repo = Path(tempfile.mkdtemp(prefix="ms-redis-drill-"))
    write_add_sub(repo)
    redis_server = RedisServer()
    redis_server.start()
    try:
        with (
            ServerProcess(repo, "--redis-url", redis_server.url) as server,
            Load(server.http_url, args.threads, args.inputs) as load,
        ):
            load.wait_sent(args.inputs)  # each input about once: warm
            measure(load, server.http_url, args.requests, "healthy")
            with Stalls(redis_server.url, args.stall_ms / 1000, args.stall_every_ms / 1000):
                measure(load, server.http_url, args.requests, "busy")
            failed0, sent0 = load.failed, load.sent
            redis_server.stop()
            time.sleep(args.down_s)  # a real outage lasts: requests keep coming meanwhile
            redis_server = RedisServer(port=redis_server.port)
            redis_server.start()
            restarted = time.monotonic()
            hits = cache_counts(server.http_url)[0]
            resumed_s: float | None = None
            while time.monotonic() - restarted < args.resume_timeout_s:
                if cache_counts(server.http_url)[0] > hits:
                    resumed_s = time.monotonic() - restarted
                    break
                time.sleep(0.01)
            down_failed, down_sent = load.failed - failed0, load.sent - sent0
            measure(load, server.http_url, args.requests, "after")
        print(
            f"outage   Redis down {args.down_s:g} s: {down_failed} of {down_sent} requests failed "
            f"from the kill until hits resumed; {load.failed} failed, {load.wrong} wrong in all"
        )
        print(
            "resume   "
            + (f"{resumed_s:.2f} s" if resumed_s is not None else f"none within {args.resume_timeout_s:g} s")
            + " from the restart to the first hit (target 2 s)"
        )
        for e in load.errors:
            print("  error:", e)
        for line in server.logs().splitlines():
            if "redis" in line:
                print("  log:", line)
    finally:
        redis_server.stop()


if __name__ == "__main__":
    main()
