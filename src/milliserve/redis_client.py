"""The one way milliserve opens Redis: redis-py's asyncio client (hiredis parses replies
when installed) with every call bounded, and a connection broken by a Redis restart
redialled once, at once, inside the same call."""

from __future__ import annotations

from typing import Any

__all__ = ["redis_client"]


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
