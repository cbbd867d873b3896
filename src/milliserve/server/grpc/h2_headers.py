"""Header blocks of an HTTP/2 connection (http2.py): HEADERS, CONTINUATION, new streams."""

from __future__ import annotations

import struct

from milliserve.server.grpc.frames import (
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    NO_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    Stream,
    frame,
)
from milliserve.server.grpc.h2_send import Http2Sending
from milliserve.server.grpc.h2_state import Http2Calm, Http2ConnectionError
from milliserve.server.grpc.hpack_decoder import HeaderBlockTooLarge, HpackError

__all__ = ["Http2Headers"]


class Http2Headers(Http2Sending):
    """HEADERS and CONTINUATION: a header block is kept (up to a cap) until it ends, then
    decoded within the header list limit, and opens, refuses or ends a stream."""

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or not sid & 1:
            raise Http2ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        n = len(payload)
        start = 0
        if flags & PADDED:
            if not payload or payload[0] >= n:
                raise Http2ConnectionError(PROTOCOL_ERROR, "bad padding")
            start, n = 1, n - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        if start > n:
            raise Http2ConnectionError(PROTOCOL_ERROR, "HEADERS too short")
        self._header_block = bytearray()
        self._header_flags = flags
        self._header_overflow = False
        self._headers_sid = sid
        if not n - start and not flags & END_HEADERS:
            self._control()
        self._add_fragment(payload[start:n], flags)

    def _add_fragment(self, fragment: bytes, flags: int) -> None:
        if self._header_overflow or len(self._header_block) + len(fragment) > self._raw_header_cap:
            # not kept: the stream is refused when the block ends (and the connection
            # closes after, since the header table can no longer follow the client's)
            self._header_overflow = True
            self._header_block = bytearray()
            self._header_skipped += len(fragment)
            if self._header_skipped > 32 * self._raw_header_cap:
                raise Http2Calm("an endless header block")
        else:
            self._header_block += fragment
        if flags & END_HEADERS:
            self._header_block_done()

    def _continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self._headers_sid != sid:
            raise Http2ConnectionError(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        # every CONTINUATION counts as a control frame: an honest block needs one or two, and
        # a flood of tiny ones would hold the loop (CVE-2024-27316)
        self._control()
        self._add_fragment(payload, flags)

    def _header_block_done(self) -> None:
        sid = self._headers_sid
        flags = self._header_flags
        block = bytes(self._header_block)
        self._headers_sid = 0
        self._header_block = bytearray()
        too_large = self._header_overflow
        self._header_skipped = 0
        headers: list[tuple[bytes, bytes]] = []
        if too_large or self._table_lost:
            self._table_lost = True  # no later block can be decoded: no new streams
            self.goaway_sent = True
        else:
            try:
                headers = self._decoder.decode(block, self.limits.max_header_list_bytes)
            except HeaderBlockTooLarge:
                too_large = True
            except HpackError as exc:
                raise Http2ConnectionError(COMPRESSION_ERROR, str(exc)) from None
        existing = self.streams.get(sid)
        if existing is not None:  # trailers from the client: the request ends here
            if not flags & END_STREAM:
                raise Http2ConnectionError(PROTOCOL_ERROR, "trailers without END_STREAM")
            existing.remote_closed = True
            self.handler.data(self, existing)
            return
        if sid <= self._last_id:
            raise Http2ConnectionError(STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        self._last_id = sid
        now = self._loop.time()
        stream = Stream(sid, self._peer_window, self._stream_recv, now)
        if flags & END_STREAM:
            stream.remote_closed = True
        if self._header_overflow:  # answered, then GOAWAY: this stream is the last one
            self._header_overflow = False
            self.streams[sid] = stream
            self.handler.refuse_headers(self, stream, self.limits.max_header_list_bytes)
            self._write(frame(GOAWAY, 0, 0, struct.pack(">LL", sid, NO_ERROR) + b"header block too large"))
            if not self.streams:
                self._close_soon()
            return
        if self.goaway_sent:
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">L", REFUSED_STREAM)))
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            # a client that ignores SETTINGS_MAX_CONCURRENT_STREAMS: refused, and counted
            # with the resets, so that opening and dropping streams stays bounded
            self.stats.refused_streams += 1
            self._count_window()
            self._resets += 1
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">L", REFUSED_STREAM)))
            if self._resets > self.limits.max_resets_per_s:
                raise Http2Calm("streams past the concurrency limit, again and again")
            return
        self.streams[sid] = stream
        self._last_active = now
        if too_large:
            self.handler.refuse_headers(self, stream, self.limits.max_header_list_bytes)
            return
        self.handler.open(self, stream, headers)
