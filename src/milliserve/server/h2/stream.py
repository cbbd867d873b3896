"""One HTTP/2 request stream as the connection keeps it, and the layer above (gRPC) as the
connection sees it."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

__all__ = ["Stream", "StreamHandler"]


class Stream:
    """One request stream. ``call`` belongs to the layer above (gRPC's calls.py)."""

    __slots__ = (
        "call",
        "data",
        "granted",
        "held_since",
        "id",
        "local_closed",
        "opened",
        "out",
        "out_end",
        "recv_window",
        "remote_closed",
        "send_window",
        "started",
        "waiter",
    )

    def __init__(self, stream_id: int, send_window: int, recv_window: int, now: float) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = recv_window
        self.granted = 0  # window granted past the initial one for the message being received
        self.data = bytearray()  # received, not yet taken as messages
        self.out = bytearray()  # DATA payload waiting for the client's window
        self.out_end: bytes | None = None  # trailers to send once ``out`` is sent
        self.remote_closed = False
        self.local_closed = False
        self.started = False  # the response HEADERS went out
        self.opened = now
        self.held_since = 0.0
        self.waiter: asyncio.Future[None] | None = None  # a sender waiting for the window
        self.call: Any = None


class StreamHandler(Protocol):
    """The gRPC layer, as the connection (``conn``, an h2_connection.Http2Protocol) sees it."""

    def open(self, conn: Any, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None: ...
    def refuse_headers(self, conn: Any, stream: Stream, limit: int) -> None: ...
    def data(self, conn: Any, stream: Stream) -> None: ...
    def reset(self, stream: Stream) -> None: ...
