"""The state of one server-side HTTP/2 connection (http2.py), and how it writes and ends."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from milliserve.server.grpc.frames import (
    DEFAULT_WINDOW,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    NO_ERROR,
    ConnectionStats,
    GrantBudget,
    Http2Limits,
    Stream,
    StreamHandler,
    frame,
)
from milliserve.server.grpc.hpack_decoder import HpackDecoder
from milliserve.server.grpc.turns import TurnBudget

__all__ = ["CONN_WINDOW", "STREAM_WINDOW", "Http2Calm", "Http2ConnectionError", "Http2State"]

# every stream may send this much before the server grants more (HTTP/2's default window): a
# message larger than this asks for a grant when its 5-byte prefix arrives
STREAM_WINDOW = DEFAULT_WINDOW
# the connection window is given back as data arrives (memory is bounded per stream and by
# the grants), so one stalled stream never stops the others
CONN_WINDOW = 16 * 1024 * 1024


class Http2State:
    """What a connection holds (its streams, windows, counts, timers), how it writes, counts
    control frames, and ends. ``Http2Protocol`` (http2.py) is this, its sending half
    (h2_send.py) and its header blocks (h2_headers.py), in that order of inheritance."""

    def __init__(
        self,
        handler: StreamHandler,
        limits: Http2Limits,
        stats: ConnectionStats,
        on_close: Callable[[Any], None],  # called with the connection, an Http2Protocol
        budget: GrantBudget | None = None,
        turns: TurnBudget | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.stats = stats
        self._on_close = on_close
        self.transport: Any = None
        self.peer = ""
        self.streams: dict[int, Stream] = {}
        self._buf = bytearray()
        self._preface = False
        self._settings_seen = False
        self._settings_acked = False
        self._decoder = HpackDecoder()
        self._last_id = 0  # the highest stream the client opened
        self._headers_sid = 0  # a header block continues on this stream
        self._header_block = bytearray()
        self._header_flags = 0
        self._header_overflow = False
        self._header_skipped = 0
        self._table_lost = False
        # header bytes kept for one block; past this the block is refused without decoding
        self._raw_header_cap = max(64 * 1024, 4 * limits.max_header_list_bytes)
        self._peer_window = DEFAULT_WINDOW  # the client's initial stream window
        self._peer_frame = 16384
        self._send_window = DEFAULT_WINDOW  # the connection's
        self._stream_recv = STREAM_WINDOW
        self._conn_recv = DEFAULT_WINDOW
        self._conn_credit = 0  # bytes received, not yet given back with WINDOW_UPDATE
        self._budget = budget or GrantBudget(limits.max_buffered_bytes)
        self._turns = turns or TurnBudget()
        self._granted = 0  # this connection's share of the grants
        self._grant_limit = 2 * (limits.max_message_bytes + 5)
        self._pending_grants: dict[Stream, int] = {}
        self._held = 0  # bytes of answers waiting for the client's window
        self._window_start = 0.0
        self._resets = 0
        self._controls = 0
        self._window_updates = 0
        self._ping_strikes = 0
        self._last_ping = 0.0
        self._sent_data_since_ping = True
        self._keepalive_sent = 0.0
        self.goaway_sent = False
        self._closing = False
        self._paused = False
        self._read_paused = False  # frames wait in _buf for this connection's turn (turns.py)
        self._drained: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self._born = now
        self._last_recv = now
        self._last_active = now
        self._age_goaway_at = 0.0

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False

    def _write(self, data: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(data)
        # a client that does not read its socket: what waits for it is bounded too
        if self._paused and t.get_write_buffer_size() > self.limits.max_unread_bytes:
            self.stats.unread_cancelled += len(self.streams)
            t.abort()

    def _count_window(self) -> None:
        now = self._loop.time()
        if now - self._window_start >= 1.0:
            self._window_start = now
            self._resets = 0
            self._controls = 0
            self._window_updates = 0

    def _control(self) -> None:
        self._count_window()
        self._controls += 1
        if self._controls > self.limits.max_control_frames_per_s:
            raise Http2Calm(f"more than {self.limits.max_control_frames_per_s} control frames in a second")

    def goaway(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        """Take no new stream; with NO_ERROR the open ones finish first."""
        if self.goaway_sent and code == NO_ERROR:
            return
        self.goaway_sent = True
        self._write(frame(GOAWAY, 0, 0, struct.pack(">LL", self._last_id, code) + debug[:256]))
        if code != NO_ERROR:
            self._linger()
        elif not self.streams:
            self._close_soon()

    def _linger(self) -> None:
        """Close after an error without losing the GOAWAY: closing a socket with unread
        bytes sends RST, and the client may then never read the GOAWAY. So stop reading
        (a flooding client's writes block, costing nothing here), send FIN after what is
        buffered, and abort two seconds later."""
        self._closing = True
        t = self.transport
        if t is None or t.is_closing():
            return
        t.pause_reading()
        if t.can_write_eof():
            t.write_eof()
        self._loop.call_later(2.0, t.abort)

    def _close_soon(self) -> None:
        """Close a second after a graceful GOAWAY, once no call is left: a client may have
        sent a new call before it read the GOAWAY. Meanwhile such calls are refused
        (REFUSED_STREAM, which clients retry on a new connection) rather than lost with the
        socket."""
        if self._close_timer is None and not self._closing:
            self._close_timer = self._loop.call_later(1.0, self._finish_close)

    def _finish_close(self) -> None:
        """Close without a reset: closing a socket with bytes unread sends RST, and the
        client would see 'connection reset' instead of the GOAWAY. So: FIN after what is
        buffered, drop what still comes, and abort 2 s later if the client has not closed."""
        self._closing = True
        t = self.transport
        if t is None or t.is_closing():
            return
        if not t.can_write_eof():
            t.close()
            return
        t.write_eof()
        self._loop.call_later(2.0, t.abort)

    def _abort(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    async def drain(self) -> None:
        """Wait until the connection has closed (after a graceful ``goaway``)."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._drained is None:
            self._drained = self._loop.create_future()
        await self._drained


class Http2ConnectionError(Exception):
    """An error of the whole connection: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


class Http2Calm(Http2ConnectionError):
    """A client past a rate limit: GOAWAY ENHANCE_YOUR_CALM."""

    def __init__(self, reason: str) -> None:
        super().__init__(ENHANCE_YOUR_CALM, reason)
