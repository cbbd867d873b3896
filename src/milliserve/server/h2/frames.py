"""HTTP/2 frames (RFC 9113 §4, §6): the wire constants, one frame's bytes, and the errors
that end a connection while its frames are read."""

from __future__ import annotations

import struct

__all__ = ["Http2Calm", "Http2ConnectionError", "frame"]

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


class Http2ConnectionError(Exception):
    """An error of the whole connection: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


class Http2Calm(Http2ConnectionError):
    """A client past a rate limit: GOAWAY ENHANCE_YOUR_CALM."""

    def __init__(self, reason: str) -> None:
        super().__init__(ENHANCE_YOUR_CALM, reason)
