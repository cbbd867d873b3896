"""Response cache: answers for repeated requests, kept in process (an LRU bounded in
bytes, the default) or in Redis (shared across replicas, with TTLs).

The key hashes what determines the answer and nothing else: the model, its version,
each input's name, datatype, shape and bytes, the outputs asked for, and the request
parameters that can change the result. The request id is never part of it, and two
models never share an entry.

Concurrent misses on one key compute once (single-flight). A Redis call that fails or
times out is a miss: the request is computed as if there were no cache and the failure
is counted. Repeated failures (5 within 1 s) open a breaker that bypasses Redis for a
moment, then lets one trial call through; the reason is logged at most once per
interval.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from milliserve.protocol.raw import array_from_raw, array_to_raw
from milliserve.protocol.types import InferRequest, InferTensor
from milliserve.redis_client import BoundedRedis, Breaker, error_reason

__all__ = [
    "CacheFactory",
    "CacheStats",
    "MemoryBackend",
    "RedisBackend",
    "ResponseCache",
    "cache_key",
    "decode_outputs",
    "encode_outputs",
]

# Request parameters about transport or scheduling, not the answer: left out of the key.
NEUTRAL_PARAMETERS = frozenset(
    {"binary_data_output", "priority", "timeout", "headers", "triton_enable_empty_final_response"}
)


def _param_bytes(params: dict[str, Any]) -> bytes:
    items = sorted((k, repr(v)) for k, v in params.items() if k not in NEUTRAL_PARAMETERS)
    return repr(items).encode()


def cache_key(model: str, version: str, request: InferRequest) -> str:
    """A hex digest of everything that determines the response (never the request id)."""
    h = hashlib.blake2b(digest_size=20)
    for part in (model.encode(), version.encode()):
        h.update(struct.pack("<I", len(part)))
        h.update(part)
    for t in sorted(request.inputs, key=lambda t: t.name):
        head = f"{t.name}\0{t.datatype}\0{','.join(map(str, t.shape))}".encode()
        body = array_to_raw(t.datatype, t.data)
        h.update(struct.pack("<II", len(head), len(body)))
        h.update(head)
        h.update(body)
    outputs = sorted(o.name for o in request.outputs) if request.outputs else []
    h.update(b"outputs\0" + "\0".join(outputs).encode())
    h.update(b"params\0" + _param_bytes(request.parameters))
    return h.hexdigest()


def encode_outputs(outputs: list[InferTensor]) -> bytes:
    """A compact, pickle-free encoding: per tensor, a length-prefixed header and raw bytes."""
    parts = [struct.pack("<I", len(outputs))]
    for t in outputs:
        head = f"{t.name}\0{t.datatype}\0{','.join(map(str, t.shape))}".encode()
        body = array_to_raw(t.datatype, t.data)
        parts += [struct.pack("<II", len(head), len(body)), head, body]
    return b"".join(parts)


def decode_outputs(blob: bytes) -> list[InferTensor]:
    (count,) = struct.unpack_from("<I", blob, 0)
    pos, out = 4, []
    for _ in range(count):
        hl, bl = struct.unpack_from("<II", blob, pos)
        pos += 8
        name, datatype, dims = blob[pos : pos + hl].decode().split("\0")
        pos += hl
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        arr = array_from_raw(name, datatype, shape, blob[pos : pos + bl])
        pos += bl
        out.append(InferTensor(name, datatype, shape, arr))
    return out


class Backend(Protocol):
    """Where entries live. ``deadline`` is an absolute ``time.perf_counter()`` (or None):
    a backend that waits on something bounds its wait by it. Raises on failure."""

    name: str

    async def get(self, key: str, deadline: float | None = None) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl_s: float, deadline: float | None = None) -> None: ...


class MemoryBackend:
    """An LRU bounded in bytes, with a TTL per entry."""

    name = "memory"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    async def get(self, key: str, deadline: float | None = None) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        expires, value = item
        if expires <= time.monotonic():
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl_s: float, deadline: float | None = None) -> None:
        size = len(value) + len(key)
        if size > self.max_bytes:
            return  # larger than the whole cache: not worth evicting everything for
        if key in self._items:
            self._drop(key)
        self._items[key] = (time.monotonic() + ttl_s, value)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._items)))

    def _drop(self, key: str) -> None:
        _, value = self._items.pop(key)
        self.bytes -= len(value) + len(key)


class RedisBackend:
    """Redis through redis-py (hiredis parser when installed), with a TTL per entry.

    Every call is bounded by ``timeout_s`` and by the request's deadline; a request with
    no time left skips Redis (a miss, not a failure). Failures feed a breaker
    (:class:`~milliserve.redis_client.Breaker`: 5 within 1 s bypass Redis for
    ``backoff_s``, then one trial call), so a dead or slow Redis costs a request nothing
    but a lookup miss, and a busy one's occasional slow answer costs only that lookup."""

    name = "redis"

    def __init__(
        self, url: str, timeout_s: float = 0.05, backoff_s: float = 1.0, prefix: str = "ms:rc:"
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.prefix = prefix
        self.redis = BoundedRedis(url, "response cache (redis)", timeout_s, backoff_s)

    @property
    def breaker(self) -> Breaker:
        return self.redis.breaker

    async def get(self, key: str, deadline: float | None = None) -> bytes | None:
        timeout = self.redis.admit(deadline)
        if timeout is None:  # bypassed, or no time left: a miss
            return None
        value = await self.redis.call(self.redis.client.get(self.prefix + key), timeout)
        return value if isinstance(value, bytes) else None

    async def set(self, key: str, value: bytes, ttl_s: float, deadline: float | None = None) -> None:
        timeout = self.redis.admit(deadline)
        if timeout is None:
            return
        px = max(1, int(ttl_s * 1000))
        await self.redis.call(self.redis.client.set(self.prefix + key, value, px=px), timeout)

    async def close(self) -> None:
        await self.redis.close()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # by reason: timeout, ConnectionError, ...
    shared: int = 0  # misses answered by another request's computation (single-flight)


class ResponseCache:
    """One model version's cache. ``get_or_compute`` is the only entry point."""

    def __init__(self, backend: Backend, ttl_s: float) -> None:
        self.backend = backend
        self.ttl_s = ttl_s
        self.stats = CacheStats()
        self._inflight: dict[str, asyncio.Future[list[InferTensor]]] = {}

    def _error(self, exc: Exception) -> None:
        """Count the failure for this model (the backend has logged it)."""
        reason = error_reason(exc)
        self.stats.errors[reason] = self.stats.errors.get(reason, 0) + 1

    async def _lookup(self, key: str, deadline: float | None) -> tuple[list[InferTensor] | None, bool]:
        """The cached outputs (None for a miss) and whether the backend answered."""
        try:
            blob = await self.backend.get(key, deadline)
        except Exception as exc:  # Redis down, slow or broken: answer without the cache
            self._error(exc)
            return None, False
        return (decode_outputs(blob) if blob is not None else None), True

    async def _store(self, key: str, outputs: list[InferTensor], deadline: float | None) -> None:
        try:
            await self.backend.set(key, encode_outputs(outputs), self.ttl_s, deadline)
        except Exception as exc:
            self._error(exc)

    async def get_or_compute(
        self,
        key: str,
        compute: Callable[[], Awaitable[list[InferTensor]]],
        deadline: float | None = None,
    ) -> tuple[list[InferTensor], bool]:
        """The outputs for ``key`` and whether they came from the cache.

        ``deadline`` (an absolute ``time.perf_counter()``, or None) bounds the cache's own
        calls: a lookup or store with no time left is skipped. Raises what ``compute``
        raises; a failing cache never fails the request."""
        cached, answered = await self._lookup(key, deadline)
        if cached is not None:
            self.stats.hits += 1
            return cached, True
        self.stats.misses += 1
        pending = self._inflight.get(key)
        if pending is not None:  # the same request is being computed: share its answer
            self.stats.shared += 1
            return await asyncio.shield(pending), False
        future: asyncio.Future[list[InferTensor]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            outputs = await compute()
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result(outputs)
        if answered:  # not after a failed lookup: one stall would count twice per request
            await self._store(key, outputs, deadline)
        return outputs, False


class CacheFactory:
    """Makes each model version's cache from its config; one Redis client for the server."""

    def __init__(
        self, redis_url: str = "redis://127.0.0.1:6379/0", timeout_s: float = 0.05, backoff_s: float = 1.0
    ) -> None:
        self.redis_url = redis_url
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._redis: RedisBackend | None = None

    def make(self, enable: bool, backend: str, ttl_s: float, max_bytes: int) -> ResponseCache | None:
        if not enable:
            return None
        if backend == "redis":
            if self._redis is None:
                self._redis = RedisBackend(self.redis_url, self.timeout_s, self.backoff_s)
            return ResponseCache(self._redis, ttl_s)
        return ResponseCache(MemoryBackend(max_bytes), ttl_s)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.close()
            self._redis = None
