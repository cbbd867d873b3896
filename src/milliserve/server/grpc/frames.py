"""HTTP/2 frames and the per-stream state of the gRPC listener (RFC 9113): the wire
constants, one frame's bytes, the limits a connection enforces, and what it counts.
The connection itself is http2.py."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ConnectionStats",
    "GrantBudget",
    "Http2Limits",
    "Stream",
    "StreamHandler",
    "frame",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT = 0, 1, 2, 3, 4
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 0xB
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
HEAD = struct.Struct(">BHBBL")  # length (24 bits as 8 + 16), type, flags, stream id
# the largest frame the server takes (SETTINGS_MAX_FRAME_SIZE): fewer frames for big tensors
MAX_FRAME = 1 << 20


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


@dataclass(frozen=True, slots=True)
class Http2Limits:
    """What one connection may hold or do; from ``GrpcSettings`` (config/settings.py)."""

    max_concurrent_streams: int = 100
    max_header_list_bytes: int = 16 * 1024
    max_message_bytes: int = 32 * 1024 * 1024
    max_resets_per_s: int = 200
    max_control_frames_per_s: int = 10_000
    min_ping_interval_s: float = 10.0
    max_ping_strikes: int = 2
    max_unread_bytes: int = 4 * 1024 * 1024
    unread_timeout_s: float = 30.0
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    max_buffered_bytes: int = 512 * 1024 * 1024  # window granted past the first 64 KiB, all connections
    max_connection_age_s: float = 0.0  # 0: no limit
    connection_age_grace_s: float = 30.0
    request_timeout_s: float = 30.0  # headers to the whole request of a unary call


class ConnectionStats:
    """What connections were stopped for; read by the metrics."""

    __slots__ = ("goaway_calm", "protocol_errors", "refused_streams", "resets_received", "unread_cancelled")

    def __init__(self) -> None:
        self.goaway_calm = 0  # connections sent GOAWAY ENHANCE_YOUR_CALM (floods)
        self.protocol_errors = 0
        self.refused_streams = 0
        self.resets_received = 0
        self.unread_cancelled = 0  # streams reset because their answer was not read


class Stream:
    """One request stream. ``call`` belongs to the gRPC layer."""

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
    """The gRPC layer, as the connection (``conn``, an http2.Http2Protocol) sees it."""

    def open(self, conn: Any, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None: ...
    def refuse_headers(self, conn: Any, stream: Stream, limit: int) -> None: ...
    def data(self, conn: Any, stream: Stream) -> None: ...
    def reset(self, stream: Stream) -> None: ...


class GrantBudget:
    """Receive window granted past each stream's first 64 KiB, for messages that announced a
    larger size: bounded per connection and over all connections together, so partial
    requests cannot fill the memory. A granted stream can always finish its message (it has
    the window for all of it), so waiting for a grant never deadlocks."""

    __slots__ = ("limit", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiting: set[Any] = set()  # connections with streams waiting for a grant

    def release(self, n: int) -> None:
        self.used -= n
        for conn in list(self.waiting):
            self.waiting.discard(conn)
            conn.retry_grants()
