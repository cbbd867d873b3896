"""Header blocks (RFC 9113 §4.3, §6.2, §6.10): a HEADERS frame and its CONTINUATION frames
are kept (up to a cap) until the block ends, then decoded (hpack_codec.py) within the
header list limit. What the block then does to a stream (open, refuse, end it) is
streams.py's."""

from __future__ import annotations

from typing import NamedTuple

from milliserve.server.h2.frames import (
    COMPRESSION_ERROR,
    END_HEADERS,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    Http2Calm,
    Http2ConnectionError,
)
from milliserve.server.h2.hpack_codec import HeaderBlockTooLarge, HpackDecoder, HpackError
from milliserve.server.h2.limits import FrameRates

__all__ = ["HeaderBlock", "HeaderBlocks"]


class HeaderBlock(NamedTuple):
    """A header block that ended."""

    stream_id: int
    flags: int  # the HEADERS frame's (END_STREAM)
    headers: list[tuple[bytes, bytes]]
    too_large: bool  # past the header list limit: the stream is refused
    overflow: bool  # past the raw cap, not decoded: answered, then GOAWAY
    lost: bool  # the header table no longer follows the client's: no new stream


class HeaderBlocks:
    """One connection's header blocks: the one being received, and its HPACK decoder."""

    __slots__ = (
        "_block",
        "_cap",
        "_decoder",
        "_flags",
        "_overflow",
        "_rates",
        "_skipped",
        "_table_lost",
        "limit",
        "sid",
    )

    def __init__(self, max_header_list_bytes: int, rates: FrameRates) -> None:
        self.limit = max_header_list_bytes
        self._rates = rates
        self._decoder = HpackDecoder()
        self.sid = 0  # a header block continues on this stream
        self._block = bytearray()
        self._flags = 0
        self._overflow = False
        self._skipped = 0
        self._table_lost = False
        # header bytes kept for one block; past this the block is refused without decoding
        self._cap = max(64 * 1024, 4 * max_header_list_bytes)

    def headers(self, flags: int, sid: int, payload: bytes) -> HeaderBlock | None:
        """A HEADERS frame: the block, if it ends here."""
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
        self._block = bytearray()
        self._flags = flags
        self._overflow = False
        self.sid = sid
        if not n - start and not flags & END_HEADERS:
            self._rates.control()
        return self._add(payload[start:n], flags)

    def continuation(self, flags: int, sid: int, payload: bytes) -> HeaderBlock | None:
        """A CONTINUATION frame: the block, if it ends here."""
        if self.sid != sid:
            raise Http2ConnectionError(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        # every CONTINUATION counts as a control frame: an honest block needs one or two, and
        # a flood of tiny ones would hold the loop (CVE-2024-27316)
        self._rates.control()
        return self._add(payload, flags)

    def _add(self, fragment: bytes, flags: int) -> HeaderBlock | None:
        if self._overflow or len(self._block) + len(fragment) > self._cap:
            # not kept: the stream is refused when the block ends (and the connection
            # closes after, since the header table can no longer follow the client's)
            self._overflow = True
            self._block = bytearray()
            self._skipped += len(fragment)
            if self._skipped > 32 * self._cap:
                raise Http2Calm("an endless header block")
        else:
            self._block += fragment
        if flags & END_HEADERS:
            return self._done()
        return None

    def _done(self) -> HeaderBlock:
        sid = self.sid
        block = bytes(self._block)
        self.sid = 0
        self._block = bytearray()
        overflow = self._overflow
        self._overflow = False
        self._skipped = 0
        too_large = overflow
        headers: list[tuple[bytes, bytes]] = []
        if overflow or self._table_lost:
            self._table_lost = True  # no later block can be decoded
        else:
            try:
                headers = self._decoder.decode(block, self.limit)
            except HeaderBlockTooLarge:
                too_large = True
            except HpackError as exc:
                raise Http2ConnectionError(COMPRESSION_ERROR, str(exc)) from None
        return HeaderBlock(sid, self._flags, headers, too_large, overflow, self._table_lost)
