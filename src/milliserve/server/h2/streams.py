"""One connection's streams (RFC 9113 §5.1): how a header block opens, refuses or ends one,
how DATA reaches it, and how either side closes or resets it.

A stream is refused (REFUSED_STREAM, which clients retry) past SETTINGS_MAX_CONCURRENT_STREAMS
or once the connection takes no new stream (``draining``); refusals count with the client's
resets (limits.py), so that opening and dropping streams stays bounded. Once ``draining``,
the connection closes when its last stream does (``on_drained``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from milliserve.server.h2.flow import STREAM_WINDOW
from milliserve.server.h2.frames import (
    DEFAULT_WINDOW,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    Http2ConnectionError,
    frame,
)
from milliserve.server.h2.header_blocks import HeaderBlock
from milliserve.server.h2.limits import ConnectionStats, FrameRates, Http2Limits
from milliserve.server.h2.stream import Stream, StreamHandler

__all__ = ["Streams"]


class Streams:
    """The open streams (``open``, by id), the highest stream the client opened (``last_id``),
    whether new ones are still taken (``draining``), and when the last one closed
    (``last_active``, for the idle timeout). ``conn`` is the connection the layer above
    (``handler``) is given with each stream; ``release`` lets go of what a closed stream holds
    elsewhere (its answer bytes, its receive grant). The client's initial window for new
    streams is ``peer_window``."""

    __slots__ = (
        "_clock",
        "_conn",
        "_handler",
        "_limits",
        "_on_drained",
        "_rates",
        "_release",
        "_stats",
        "_write",
        "draining",
        "last_active",
        "last_id",
        "open",
        "peer_window",
    )

    def __init__(
        self,
        conn: Any,
        handler: StreamHandler,
        limits: Http2Limits,
        stats: ConnectionStats,
        rates: FrameRates,
        clock: Callable[[], float],
        write: Callable[[bytes], None],
        release: Callable[[Stream], None],
        on_drained: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._handler = handler
        self._limits = limits
        self._stats = stats
        self._rates = rates
        self._clock = clock
        self._write = write
        self._release = release
        self._on_drained = on_drained  # draining, and no stream is left
        self.open: dict[int, Stream] = {}
        self.peer_window = DEFAULT_WINDOW  # the client's initial stream window (SETTINGS)
        self.last_id = 0  # the highest stream the client opened
        self.draining = False  # no new stream: GOAWAY was sent or received, or HPACK was lost
        self.last_active = clock()

    # ---- what the client sends ----
    def header_block(self, block: HeaderBlock) -> None:
        """A header block ended: it opens, refuses or ends a stream."""
        sid = block.stream_id
        if block.lost:
            self.draining = True  # no later block can be decoded: no new streams
        existing = self.open.get(sid)
        if existing is not None:  # trailers from the client: the request ends here
            if not block.flags & END_STREAM:
                raise Http2ConnectionError(PROTOCOL_ERROR, "trailers without END_STREAM")
            existing.remote_closed = True
            self._handler.data(self._conn, existing)
            return
        if sid <= self.last_id:
            raise Http2ConnectionError(STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        self.last_id = sid
        now = self._clock()
        stream = Stream(sid, self.peer_window, STREAM_WINDOW, now)
        if block.flags & END_STREAM:
            stream.remote_closed = True
        if block.overflow:  # answered, then GOAWAY: this stream is the last one
            self.open[sid] = stream
            self._handler.refuse_headers(self._conn, stream, self._limits.max_header_list_bytes)
            self._write(frame(GOAWAY, 0, 0, struct.pack(">LL", sid, NO_ERROR) + b"header block too large"))
            if not self.open:
                self._on_drained()
            return
        if self.draining:
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">L", REFUSED_STREAM)))
            return
        if len(self.open) >= self._limits.max_concurrent_streams:
            # a client that ignores SETTINGS_MAX_CONCURRENT_STREAMS: refused, and counted
            # with the resets, so that opening and dropping streams stays bounded
            self._stats.refused_streams += 1
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">L", REFUSED_STREAM)))
            self._rates.refused()
            return
        self.open[sid] = stream
        self.last_active = now
        if block.too_large:
            self._handler.refuse_headers(self._conn, stream, self._limits.max_header_list_bytes)
            return
        self._handler.open(self._conn, stream, block.headers)

    def data(self, flags: int, sid: int, payload: bytes | memoryview) -> None:
        """A DATA frame, counted against the connection window already (flow.py)."""
        n = len(payload)
        if flags & PADDED:
            if not payload or payload[0] >= n:
                raise Http2ConnectionError(PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : n - payload[0]]
        stream = self.open.get(sid)
        if stream is None or stream.remote_closed:
            if sid == 0 or sid > self.last_id or stream is not None:
                code = STREAM_CLOSED if stream else PROTOCOL_ERROR
                raise Http2ConnectionError(code, "DATA on a closed stream")
            # a stream reset, refused or finished here: what was on the wire is dropped; tiny
            # frames count as control frames, as on open streams (an honest client's DATA in
            # flight after a refusal is a whole message, and a retry storm sends many)
            if len(payload) < 16:
                self._rates.control()
            return
        if len(payload) < 16 and not flags & END_STREAM:
            # empty or tiny DATA frames are a flood of their own (CVE-2019-9518): a gRPC
            # message alone is 5 bytes of prefix and more
            self._rates.control()
        stream.recv_window -= n
        if stream.recv_window < 0:
            self.reset(stream, FLOW_CONTROL_ERROR)
            return
        stream.data += payload
        if flags & END_STREAM:
            stream.remote_closed = True
        self._handler.data(self._conn, stream)

    def rst(self, sid: int, payload: bytes) -> None:
        """RST_STREAM from the client (counted: Rapid Reset, CVE-2023-44487)."""
        if len(payload) != 4:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if sid == 0 or sid > self.last_id:
            raise Http2ConnectionError(PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
        self._stats.resets_received += 1
        self._rates.reset()
        stream = self.open.get(sid)
        if stream is not None:
            self.drop(stream)

    def initial_window(self, value: int) -> None:
        """The client's SETTINGS_INITIAL_WINDOW_SIZE: every open stream's send window
        moves by the change (RFC 9113 §6.9.2)."""
        delta = value - self.peer_window
        self.peer_window = value
        for stream in self.open.values():
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise Http2ConnectionError(FLOW_CONTROL_ERROR, "a stream window past 2^31-1")

    # ---- closing ----
    def local_close(self, stream: Stream) -> None:
        """The answer is all sent."""
        stream.local_closed = True
        if stream.waiter is not None and not stream.waiter.done():
            stream.waiter.set_result(None)
        if not stream.remote_closed:
            # answered before the request ended (an error): tell the client to stop sending
            self._write(frame(RST_STREAM, 0, stream.id, struct.pack(">L", NO_ERROR)))
            stream.remote_closed = True
        self._release(stream)
        self.open.pop(stream.id, None)
        self.last_active = self._clock()
        if self.draining and not self.open:
            self._on_drained()

    def reset(self, stream: Stream, code: int) -> None:
        """Reset a stream from the server's side (and stop its call)."""
        self._write(frame(RST_STREAM, 0, stream.id, struct.pack(">L", code)))
        self.drop(stream)

    def drop(self, stream: Stream) -> None:
        """Close a stream at once, and stop its call."""
        if stream.local_closed and stream.id not in self.open:
            return
        stream.local_closed = stream.remote_closed = True
        self._release(stream)
        if stream.waiter is not None and not stream.waiter.done():
            stream.waiter.set_result(None)
        self.open.pop(stream.id, None)
        self._handler.reset(stream)
        if self.draining and not self.open:
            self._on_drained()

    def drop_all(self) -> None:
        for stream in list(self.open.values()):
            self.drop(stream)
