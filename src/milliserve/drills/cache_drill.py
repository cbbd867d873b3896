"""A response-cache drill: a model with a Redis response cache, client threads sending a
fixed set of inputs round-robin, and a neighbour that keeps Redis busy. Shared by
tests/e2e/test_redis_breaker.py (assertions) and benchmarks/redis_cache_drill.py (figures)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType

import httpx
import numpy as np
import onnx
import redis
from onnx import TensorProto, helper

__all__ = ["CONFIG", "Load", "Stalls", "cache_counts", "write_add_sub"]

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

    def __init__(self, http_url: str, threads: int = 4, inputs: int = 50) -> None:
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

    def __init__(self, url: str, stall_s: float = 0.01, every_s: float = 0.1) -> None:
        self.client = redis.Redis.from_url(url)
        self.stall_s, self.every_s = stall_s, every_s
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.client.execute_command("DEBUG", "SLEEP", str(self.stall_s))  # type: ignore[no-untyped-call]
            self.count += 1

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
    """(hits, misses) of the drill's model, from Triton's statistics."""
    stats = httpx.get(f"http://{http_url}/v2/models/add_sub/stats").json()
    s = stats["model_stats"][0]["inference_stats"]
    return int(s["cache_hit"]["count"]), int(s["cache_miss"]["count"])
