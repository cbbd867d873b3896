"""What the connections of one HTTP listener share (``server/http/connection.py``): its
limits, the answers it refuses with, prepared once, and the lingering close of a refused
connection."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from milliserve.protocol.json_codec import encode_json

__all__ = ["LINGER_S", "ConnectionLimits", "Lingering", "Listener", "answer"]

# after an error answer, what the client still sends is read and dropped for at most this long
LINGER_S = 2.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The limits of one listener (from ``HttpSettings``)."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_s: float
    max_connections: int

    @property
    def keep_alive_header(self) -> tuple[str, str]:
        """``Keep-Alive: timeout=N``, whole seconds rounded down, so clients give up first."""
        return ("keep-alive", f"timeout={int(self.keep_alive_s)}")


def answer(status: int, phrase: str, message: str) -> bytes:
    """A whole error response that closes the connection: ``{"error": message}``."""
    body = encode_json({"error": message})
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class Listener:
    """What the connections of one listener share: limits, prepared answers, refusal counts."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.tick_s = min(limits.header_timeout_s, limits.body_timeout_s, limits.keep_alive_s)
        self.too_large = answer(
            431,
            "Request Header Fields Too Large",
            f"request line and headers are over the limit of {limits.max_header_bytes} bytes "
            "(max_header_bytes)",
        )
        self.head_timeout = answer(
            408,
            "Request Timeout",
            f"request headers not complete within {limits.header_timeout_s:g} s (header_timeout_s)",
        )
        self.body_timeout = answer(
            408,
            "Request Timeout",
            f"request body not complete within {limits.body_timeout_s:g} s (body_timeout_s)",
        )
        self.invalid = answer(400, "Bad Request", "invalid HTTP request")
        self.busy = answer(
            503,
            "Service Unavailable",
            f"the server is at its limit of {limits.max_connections} open connections (max_connections)",
        )
        self.refused = 0
        self.refused_logged_at = -math.inf
        self._heads: tuple[bytes, bytes] | None = None

    def heads(self, default_headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
        """The header lines every response carries: on a connection kept alive, and on
        one that closes after it (without the keep-alive header)."""
        if self._heads is None:
            lines = b"".join(name + b": " + value + b"\r\n" for name, value in default_headers)
            closing = b"".join(
                name + b": " + value + b"\r\n" for name, value in default_headers if name != b"keep-alive"
            )
            self._heads = (lines, closing + b"connection: close\r\n")
        return self._heads


class Lingering(asyncio.Protocol):
    """A refused connection after its answer: drops what the client still sends, and
    closes at the client's EOF or after ``LINGER_S``. Still counted as open."""

    def __init__(
        self, transport: asyncio.Transport, connections: set[Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.transport = transport
        self.connections = connections
        connections.add(self)
        self.timer = loop.call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.connections.discard(self)

    def shutdown(self) -> None:
        """Called by the server when it stops."""
        self.transport.close()
