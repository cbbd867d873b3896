"""The Prometheus endpoint: ``GET /metrics`` on the metrics port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["MetricsApp"]


class MetricsApp:
    """A minimal ASGI app exposing one registry (every worker's, merged, with --workers)."""

    def __init__(self, metrics: Callable[[], Awaitable[bytes]]) -> None:
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics":
            status, body, ctype = 200, await self.metrics(), CONTENT_TYPE_LATEST
        else:
            status, body, ctype = 404, b"not found; metrics are at /metrics\n", "text/plain"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
