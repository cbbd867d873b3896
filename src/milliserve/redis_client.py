"""The one way milliserve opens Redis: redis-py's asyncio client (hiredis parses replies
when installed) with every call bounded, and a connection broken by a Redis restart
redialled once, at once, inside the same call; and the breaker that keeps a failing
Redis out of the request path for a while."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

__all__ = ["Breaker", "error_reason", "redis_client"]

log = logging.getLogger(__name__)


def error_reason(exc: BaseException) -> str:
    """A metric label for a failed call: ``timeout`` or the exception's class name."""
    return "timeout" if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) else type(exc).__name__


class Breaker:
    """After a failure, skip the dependency for ``backoff_s`` (a dead or slow Redis then
    costs a request nothing), and log failures at most once per ``log_interval_s``."""

    def __init__(self, what: str, backoff_s: float, log_interval_s: float = 10.0) -> None:
        self.what, self.backoff_s, self.log_interval_s = what, backoff_s, log_interval_s
        self.errors = 0
        self._skip_until = 0.0
        self._last_log = -1e9

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._skip_until

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        now = time.monotonic()
        self._skip_until = now + self.backoff_s
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            log.warning("%s unavailable, bypassed: %s (%d errors so far)", self.what, exc, self.errors)


def redis_client(url: str, timeout_s: float) -> Any:
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return aredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=max(timeout_s, 0.05),
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError],
    )
