"""A Redis response cache under steady load from 4 client threads: a healthy, merely busy
Redis (another client's 10 ms command every 100 ms) keeps answering (issue 10: one 5 ms
timeout used to bypass it for a second, and the hit ratio fell to 0.05), and a Redis
killed and restarted on the same port costs no request, with hits coming back by
themselves. benchmarks/redis_cache_drill.py runs the same drill and reports the figures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx
import numpy as np
import pytest
import redis

from milliserve.testing import RedisServer, ServerProcess

pytestmark = pytest.mark.e2e

CACHED_REDIS = """
name: "add_sub"
max_batch_size: 8
response_cache { enable: true backend: "redis" ttl_s: 300 }
"""

INPUTS = [np.array([i, i + 0.5, -i, 1.0], dtype=np.float32) for i in range(50)]


class Load:
    """Client threads sending the 50 inputs round-robin (each from its own offset) until
    the block ends; counts requests sent, failed, and answered wrongly."""

    def __init__(self, http_url: str, threads: int = 4) -> None:
        self.url = f"http://{http_url}/v2/models/add_sub/infer"
        self.sent = self.failed = self.wrong = 0
        self.first_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(t * 13,)) for t in range(threads)]

    def _send(self, offset: int) -> None:
        with httpx.Client(timeout=30) as client:
            i = offset
            while not self._stop.is_set():
                x = INPUTS[i % len(INPUTS)]
                i += 1
                tensor = {"datatype": "FP32", "shape": [1, 4], "data": x.tolist()}
                body = {"inputs": [{"name": n, **tensor} for n in ("INPUT0", "INPUT1")]}
                error, wrong = "", False
                try:
                    r = client.post(self.url, json=body)
                    if r.status_code != 200:
                        error = f"HTTP {r.status_code}: {r.text}"
                    else:
                        out = next(o for o in r.json()["outputs"] if o["name"] == "OUTPUT0")
                        wrong = out["data"] != (2 * x).tolist()
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.sent += 1
                    self.wrong += wrong
                    if error:
                        self.failed += 1
                        self.first_error = self.first_error or error

    def wait_sent(self, n: int, timeout_s: float) -> None:
        assert wait_for(lambda: self.sent >= n, timeout_s) is not None, f"{self.sent} of {n} sent"

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
    """A busy Redis: another client's slow command holds it for ``stall_s`` every
    ``every_s`` (DEBUG SLEEP), as a neighbour's big command would."""

    def __init__(self, url: str, stall_s: float = 0.01, every_s: float = 0.1) -> None:
        self.client = redis.Redis.from_url(url)
        self.stall_s, self.every_s = stall_s, every_s
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.client.execute_command("DEBUG", "SLEEP", str(self.stall_s))
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


def wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``condition()`` held (polled), or None if it did not within ``timeout_s``."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.02)
    return time.monotonic() - t0


def cache_counts(http_url: str) -> dict[str, int]:
    stats = httpx.get(f"http://{http_url}/v2/models/add_sub/stats").json()
    s = stats["model_stats"][0]["inference_stats"]
    return {"hit": int(s["cache_hit"]["count"]), "miss": int(s["cache_miss"]["count"])}


def test_busy_redis_keeps_its_hit_ratio_and_a_restart_fails_no_request(
    tmp_path: Path, write_add_sub: Callable[..., Path]
) -> None:
    write_add_sub(tmp_path, config=CACHED_REDIS)
    redis_server = RedisServer()
    redis_server.start()
    try:
        with ServerProcess(tmp_path, "--redis-url", redis_server.url) as server:
            with Load(server.http_url, threads=4) as load:
                load.wait_sent(len(INPUTS), timeout_s=60)  # each input seen about once: warm
                with Stalls(redis_server.url) as stalls:  # 10 ms stalls: a 5 ms bound trips on each
                    before = cache_counts(server.http_url)
                    load.wait_sent(load.sent + 1000, timeout_s=120)
                    after = cache_counts(server.http_url)
                assert stalls.count > 0
                hits, misses = after["hit"] - before["hit"], after["miss"] - before["miss"]
                ratio = hits / max(1, hits + misses)
                assert ratio >= 0.9, f"hit ratio {ratio:.3f} ({hits} hits, {misses} misses), expected >= 0.9"

                redis_server.stop()
                load.wait_sent(load.sent + 200, timeout_s=60)  # served while Redis is down
                redis_server = RedisServer(port=redis_server.port)  # same port, empty
                redis_server.start()
                back = cache_counts(server.http_url)["hit"]
                resumed_s = wait_for(lambda: cache_counts(server.http_url)["hit"] >= back + 20, timeout_s=15)
                assert resumed_s is not None, f"no hits 15 s after Redis came back:\n{server.logs()}"
            assert load.failed == 0, f"{load.failed} of {load.sent} requests failed: {load.first_error}"
            assert load.wrong == 0, f"{load.wrong} of {load.sent} answers were wrong"
        assert "response cache (redis) unavailable, bypassed for 1 s: connection refused" in server.logs()
    finally:
        redis_server.stop()
