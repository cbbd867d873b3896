"""Response cache through real servers and tritonclient: in-process LRU by default, Redis
shared by two replicas, Triton's cache statistics and Prometheus counters."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from milliserve.testing import RedisServer, ServerProcess

pytestmark = pytest.mark.e2e

CACHED = """
name: "add_sub"
max_batch_size: 8
response_cache { enable: true }
"""

CACHED_REDIS = """
name: "add_sub"
max_batch_size: 8
response_cache { enable: true backend: "redis" ttl_s: 30 }
"""


def _infer(client: httpclient.InferenceServerClient, x: np.ndarray, rid: str) -> np.ndarray:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = httpclient.InferInput(name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        inputs.append(inp)
    return client.infer("add_sub", inputs, request_id=rid).as_numpy("OUTPUT0")


def _cache_stats(client: httpclient.InferenceServerClient) -> dict[str, int]:
    s = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]
    return {"hit": int(s["cache_hit"]["count"]), "miss": int(s["cache_miss"]["count"])}


def test_repeated_requests_are_answered_from_the_cache_whatever_their_id(
    tmp_path: Path, write_add_sub: Callable[..., Path]
) -> None:
    write_add_sub(tmp_path, config=CACHED)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ServerProcess(tmp_path) as server, httpclient.InferenceServerClient(server.http_url) as client:
        first = _infer(client, x, "a")
        again = _infer(client, x, "b")  # another id, same request: a hit
        np.testing.assert_array_equal(first, x + x)
        np.testing.assert_array_equal(again, first)
        _infer(client, x + 1, "c")  # other data: a miss
        assert _cache_stats(client) == {"hit": 1, "miss": 2}
        config = client.get_model_config("add_sub")
        assert config["response_cache"]["enable"] is True and config["response_cache"]["backend"] == "memory"
        metrics = httpx.get(server.metrics_url).text
        assert 'milliserve_cache_hits_total{model="add_sub",version="1"} 1.0' in metrics
        assert 'milliserve_cache_misses_total{model="add_sub",version="1"} 2.0' in metrics
    # and over gRPC the same config reads back
    with ServerProcess(tmp_path) as server, grpcclient.InferenceServerClient(server.grpc_url) as gclient:
        cfg = gclient.get_model_config("add_sub", as_json=True)["config"]
        assert cfg["response_cache"]["enable"] is True


def test_two_replicas_share_answers_through_redis_and_survive_its_outage(
    tmp_path: Path, write_add_sub: Callable[..., Path], poll: Any
) -> None:
    write_add_sub(tmp_path, config=CACHED_REDIS)
    x = np.full((1, 4), 3.0, dtype=np.float32)
    with RedisServer() as redis_server:
        # a Redis bound far above a healthy call on a loaded CI machine, where the default 50 ms
        # was sometimes missed by a first call (it dials Redis); a stopped Redis refuses at once
        env = {**os.environ, "MILLISERVE_REDIS__BACKOFF_S": "0.2", "MILLISERVE_REDIS__TIMEOUT_MS": "1000"}
        with (
            ServerProcess(tmp_path, env={**env, "MILLISERVE_REDIS__URL": redis_server.url}) as a,
            ServerProcess(tmp_path, "--redis-url", redis_server.url, env=env) as b,  # flag or env
            httpclient.InferenceServerClient(a.http_url) as ca,
            httpclient.InferenceServerClient(b.http_url) as cb,
        ):
            _infer(ca, x, "1")
            _infer(cb, x, "2")  # computed by replica a, answered by b from Redis
            assert _cache_stats(ca) == {"hit": 0, "miss": 1} and _cache_stats(cb) == {"hit": 1, "miss": 0}
            redis_server.stop()
            for i in range(10):  # Redis down: every request still answered, correctly
                np.testing.assert_array_equal(_infer(cb, x + i, f"d{i}"), 2 * (x + i))
            metrics = httpx.get(b.metrics_url).text
            assert 'milliserve_cache_errors_total{model="add_sub"' in metrics
            redis_server.start()
            _infer(ca, x + 100, "r1")  # stored by a (its broken connection redialled) ...

            def found_by_b() -> bool:  # ... and found by b once its breaker lets Redis back
                _infer(cb, x + 100, "r2")
                return _cache_stats(cb)["hit"] >= 2

            poll.until(found_by_b, timeout_s=15, what="replica b finding a's answer in Redis")
            assert _cache_stats(cb)["hit"] == 2  # both recovered without a restart
