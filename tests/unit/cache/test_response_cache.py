"""Response cache: keys, the in-process LRU, single-flight, and the Redis backend on a real
redis-server, including the outage and slow-Redis drills."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import numpy as np
import pytest
import redis

from milliserve.cache.response_cache import (
    MemoryBackend,
    RedisBackend,
    ResponseCache,
    cache_key,
    decode_outputs,
    encode_outputs,
)
from milliserve.protocol.types import InferRequest, InferTensor, RequestedOutput
from milliserve.testing import RedisServer


def _request(x: list[float], rid: str = "", **params: object) -> InferRequest:
    arr = np.array([x], dtype=np.float32)
    return InferRequest("m", "", [InferTensor("x", "FP32", arr.shape, arr)], id=rid, parameters=dict(params))


def _outputs(v: float) -> list[InferTensor]:
    y = np.array([[v, 1 - v]], dtype=np.float32)
    return [InferTensor("y", "FP32", y.shape, y)]


def test_key_covers_model_version_inputs_outputs_and_parameters_but_not_the_id() -> None:
    base = cache_key("fraud", "1", _request([1, 2], rid="a"))
    assert cache_key("fraud", "1", _request([1, 2], rid="b")) == base  # the id never counts
    assert cache_key("fraud", "1", _request([1, 2], priority=1, timeout=5000)) == base  # scheduling only
    assert cache_key("other", "1", _request([1, 2])) != base  # two models never share answers
    assert cache_key("fraud", "2", _request([1, 2])) != base
    assert cache_key("fraud", "1", _request([1, 3])) != base
    assert cache_key("fraud", "1", _request([1, 2], threshold=0.7)) != base  # may change the answer
    asked = _request([1, 2])
    asked.outputs = [RequestedOutput("y")]
    assert cache_key("fraud", "1", asked) != base
    reshaped = _request([1, 2])
    reshaped.inputs[0] = InferTensor("x", "FP32", (2, 1), reshaped.inputs[0].data.reshape(2, 1))
    assert cache_key("fraud", "1", reshaped) != base  # same bytes, other shape


def test_outputs_round_trip_without_pickle() -> None:
    text = np.array([b"approve", b"r\xc3\xa9view"], dtype=object)
    outs = [*_outputs(0.25), InferTensor("label", "BYTES", (2,), text)]
    back = decode_outputs(encode_outputs(outs))
    assert [t.name for t in back] == ["y", "label"] and back[1].shape == (2,)
    np.testing.assert_array_equal(back[0].data, outs[0].data)
    assert list(back[1].data) == [b"approve", b"r\xc3\xa9view"]


def test_memory_backend_is_an_lru_bounded_in_bytes_with_ttl(poll: Any) -> None:
    async def main() -> None:
        mem = MemoryBackend(max_bytes=300)
        for i in range(5):  # 5 entries of ~100 bytes: only the newest fit
            await mem.set(f"k{i}", bytes(90), ttl_s=60)
            if i == 1:
                assert await mem.get("k0") is not None  # k0 is now the most recent
        assert mem.bytes <= 300 and len(mem) == 3
        assert await mem.get("k1") is None and await mem.get("k4") is not None
        await mem.set("big", bytes(1000), ttl_s=60)  # larger than the whole cache: not kept
        assert await mem.get("big") is None and len(mem) == 3
        await mem.set("short", bytes(10), ttl_s=0.3)
        assert await mem.get("short") is not None
        waited = await poll.until_async(
            lambda: _is_none(mem.get("short")), timeout_s=10, what="the entry expiring"
        )
        assert waited > 0.1  # kept until its TTL ran out, not dropped at the next look

    asyncio.run(main())


def test_concurrent_misses_compute_once() -> None:
    async def main() -> None:
        cache = ResponseCache(MemoryBackend(1 << 20), ttl_s=60)
        calls = 0

        async def compute() -> list[InferTensor]:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.05)
            return _outputs(0.5)

        results = await asyncio.gather(*(cache.get_or_compute("k", compute) for _ in range(10)))
        assert calls == 1 and all(not hit for _, hit in results)
        assert cache.stats.misses == 10 and cache.stats.shared == 9
        outputs, hit = await cache.get_or_compute("k", compute)
        assert hit and calls == 1 and float(outputs[0].data[0, 0]) == 0.5

    asyncio.run(main())


def test_a_failed_computation_fails_its_waiters_and_is_not_cached() -> None:
    async def main() -> None:
        cache = ResponseCache(MemoryBackend(1 << 20), ttl_s=60)

        async def boom() -> list[InferTensor]:
            await asyncio.sleep(0.01)
            raise ValueError("model failed")

        results = await asyncio.gather(
            *(cache.get_or_compute("k", boom) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, ValueError) for r in results)
        _, hit = await cache.get_or_compute("k", lambda: _ready(_outputs(0.1)))
        assert not hit

    asyncio.run(main())


async def _ready(outputs: list[InferTensor]) -> list[InferTensor]:
    return outputs


async def _is_none(value: Awaitable[object]) -> bool:
    return await value is None


# A Redis call's bound in the drills below: far above a healthy call even on a loaded CI
# machine (where a 20-50 ms bound was sometimes missed by a first dial or the redial after a
# pause), and far below PAUSE_MS, the time a paused Redis answers nobody.
SLOW_S = 0.25
PAUSE_MS = 1000


@pytest.fixture
def redis_server() -> RedisServer:
    with RedisServer() as server:
        yield server  # type: ignore[misc]


def test_redis_backend_is_shared_across_replicas_and_expires(redis_server: RedisServer, poll: Any) -> None:
    async def main() -> None:
        a = ResponseCache(RedisBackend(redis_server.url, timeout_s=SLOW_S), ttl_s=1.0)
        b = ResponseCache(RedisBackend(redis_server.url, timeout_s=SLOW_S), ttl_s=1.0)  # another replica
        _, hit = await a.get_or_compute("k", lambda: _ready(_outputs(0.9)))
        assert not hit
        outputs, hit = await b.get_or_compute("k", lambda: _ready(_outputs(0.0)))
        assert hit and float(outputs[0].data[0, 0]) == pytest.approx(0.9)

        async def expired() -> bool:
            _, hit = await b.get_or_compute("k", lambda: _ready(_outputs(0.0)))
            return not hit

        await poll.until_async(expired, timeout_s=10, what="the TTL expiring in Redis")
        assert not a.stats.errors and not b.stats.errors  # misses because it expired, not failures
        for c in (a, b):
            await c.backend.close()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_redis_outage_is_bypassed_and_recovers_by_itself(redis_server: RedisServer, poll: Any) -> None:
    async def main() -> None:
        backend = RedisBackend(redis_server.url, timeout_s=SLOW_S, backoff_s=0.2)
        cache = ResponseCache(backend, ttl_s=60)
        await cache.get_or_compute("k", lambda: _ready(_outputs(0.3)))
        assert (await cache.get_or_compute("k", lambda: _ready(_outputs(0.0))))[1]
        redis_server.stop()
        for i in range(20):  # every request is answered, none waits on the dead Redis
            t0 = time.perf_counter()
            outputs, hit = await cache.get_or_compute(f"down{i}", lambda: _ready(_outputs(0.7)))
            assert not hit and float(outputs[0].data[0, 0]) == pytest.approx(0.7)
            # refused at once, then bypassed: well under the 1 s socket backstop, a loaded machine too
            assert time.perf_counter() - t0 < 0.5
        assert sum(cache.stats.errors.values()) >= 5 and backend.breaker.state != "closed"
        redis_server.start()
        found: list[list[InferTensor]] = []

        async def back() -> bool:  # past the backoff a trial call finds Redis back
            await cache.get_or_compute("back", lambda: _ready(_outputs(0.2)))
            outputs, hit = await cache.get_or_compute("back", lambda: _ready(_outputs(0.0)))
            found[:] = [outputs]
            return hit

        await poll.until_async(back, timeout_s=30, what="Redis answering again")
        assert float(found[0][0].data[0, 0]) == pytest.approx(0.2)
        assert backend.breaker.state == "closed"
        await backend.close()

    asyncio.run(main())


def test_slow_redis_never_stalls_a_request(redis_server: RedisServer) -> None:
    async def main() -> None:
        backend = RedisBackend(redis_server.url, timeout_s=0.05, backoff_s=0.05)
        cache = ResponseCache(backend, ttl_s=60)
        await cache.get_or_compute("warm", lambda: _ready(_outputs(0.1)))
        pauser = _pause(redis_server.url, PAUSE_MS)  # Redis answers nobody for 1 s from now
        worst = 0.0
        for i in range(10):
            t0 = time.perf_counter()
            _, hit = await cache.get_or_compute(f"slow{i}", lambda: _ready(_outputs(0.4)))
            worst = max(worst, time.perf_counter() - t0)
            assert not hit
        # bounded by the 50 ms timeout (plus a loaded machine's delays), not by the pause
        assert worst < PAUSE_MS / 1e3 / 3, worst
        assert cache.stats.errors.get("timeout", 0) >= 1
        await _pause_over(pauser)
        await backend.close()

    asyncio.run(main())


def _pause(url: str, ms: int) -> redis.Redis:
    """Make Redis answer nobody for ``ms`` (CLIENT PAUSE returns at once, then holds every
    client's commands); the returned client's next command returns when the pause ends."""
    pauser = redis.Redis.from_url(url)
    assert pauser.execute_command("CLIENT", "PAUSE", str(ms), "ALL")
    return pauser


async def _pause_over(pauser: redis.Redis) -> None:
    await asyncio.get_running_loop().run_in_executor(None, pauser.ping)
    pauser.close()


def test_a_few_slow_answers_do_not_bypass_a_busy_redis(redis_server: RedisServer, poll: Any) -> None:
    async def main() -> None:
        backend = RedisBackend(redis_server.url, timeout_s=SLOW_S, backoff_s=60)
        cache = ResponseCache(backend, ttl_s=60)

        async def stored() -> bool:  # the first calls also dial Redis
            return (await cache.get_or_compute("k", lambda: _ready(_outputs(0.6))))[1]

        await poll.until_async(stored, timeout_s=10, what="the entry stored in Redis")
        errors = sum(cache.stats.errors.values())
        pauser = _pause(redis_server.url, PAUSE_MS)
        slow = await asyncio.gather(
            *(cache.get_or_compute("k", lambda: _ready(_outputs(0.0))) for _ in range(4))
        )
        assert not any(hit for _, hit in slow)
        assert cache.stats.errors.get("timeout", 0) - errors == 4, cache.stats.errors
        await _pause_over(pauser)
        outputs, hit = await cache.get_or_compute("k", lambda: _ready(_outputs(0.0)))
        assert hit and float(outputs[0].data[0, 0]) == pytest.approx(0.6)  # not bypassed for 60 s
        assert backend.breaker.state == "closed"
        await backend.close()

    asyncio.run(main())


def test_timed_out_calls_leave_the_connection_pool_usable(redis_server: RedisServer) -> None:
    async def main() -> None:
        backend = RedisBackend(redis_server.url, timeout_s=SLOW_S, backoff_s=60)
        await backend.set("a", b"A", ttl_s=60)
        await backend.set("b", b"B", ttl_s=60)
        pauser = _pause(redis_server.url, PAUSE_MS)
        late = await asyncio.gather(*(backend.get("a") for _ in range(4)), return_exceptions=True)
        assert all(isinstance(r, TimeoutError) for r in late), late
        await _pause_over(pauser)  # the cancelled GETs' replies are sent now ...
        got = await asyncio.gather(*(backend.get(k) for k in "bababa"))
        assert got == [b"B", b"A"] * 3  # ... and never read as another call's answer
        assert backend.breaker.state == "closed" and backend.breaker.errors == 4
        await backend.close()

    asyncio.run(main())


def test_the_request_deadline_bounds_redis_and_no_time_left_skips_it(redis_server: RedisServer) -> None:
    async def main() -> None:
        backend = RedisBackend(redis_server.url, timeout_s=5.0, backoff_s=60)
        cache = ResponseCache(backend, ttl_s=60)
        await cache.get_or_compute("k", lambda: _ready(_outputs(0.8)))
        pauser = _pause(redis_server.url, 1000)
        # bounded by the 5 s timeout this would wait the pause out and hit; the deadline wins
        _, hit = await cache.get_or_compute(
            "k", lambda: _ready(_outputs(0.0)), deadline=time.perf_counter() + 0.2
        )
        assert not hit and cache.stats.errors == {"timeout": 1}
        await _pause_over(pauser)
        errors = backend.breaker.errors
        outputs, hit = await cache.get_or_compute(
            "late", lambda: _ready(_outputs(0.5)), deadline=time.perf_counter() - 0.001
        )
        assert not hit and float(outputs[0].data[0, 0]) == pytest.approx(0.5)
        assert backend.breaker.errors == errors and cache.stats.errors == {"timeout": 1}  # not a failure
        assert await backend.get("late") is None  # nor stored: no time was left for that either
        assert (await cache.get_or_compute("k", lambda: _ready(_outputs(0.0)), deadline=None))[1]
        await backend.close()

    asyncio.run(main())
