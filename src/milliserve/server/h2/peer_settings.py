"""The SETTINGS exchange (RFC 9113 §6.5): the server's settings, sent first, and the
client's, applied as they come. The client must open with SETTINGS (``seen``) and
acknowledge the server's within the handshake timeout (``acked``, checked by the
connection's timer)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from milliserve.server.h2.answers import Answers
from milliserve.server.h2.flow import STREAM_WINDOW
from milliserve.server.h2.frames import (
    ACK,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_FRAME,
    MAX_WINDOW,
    PROTOCOL_ERROR,
    SETTINGS,
    Http2ConnectionError,
    frame,
)
from milliserve.server.h2.limits import Http2Limits
from milliserve.server.h2.streams import Streams

__all__ = ["PeerSettings"]


class PeerSettings:
    """One connection's SETTINGS: what the server announces, and the client's frames (its
    initial stream window goes to ``Streams``, its largest frame to ``Answers``)."""

    __slots__ = ("_answers", "_limits", "_streams", "_write", "acked", "seen")

    def __init__(
        self, limits: Http2Limits, streams: Streams, answers: Answers, write: Callable[[bytes], None]
    ) -> None:
        self._limits = limits
        self._streams = streams
        self._answers = answers
        self._write = write
        self.seen = False  # the client's SETTINGS arrived
        self.acked = False  # the client acknowledged the server's

    def ours(self) -> bytes:
        """The server's SETTINGS frame, the first it sends: its limits, told to the client."""
        settings = struct.pack(
            ">HLHLHLHLHL",
            0x3, self._limits.max_concurrent_streams,  # MAX_CONCURRENT_STREAMS
            0x4, STREAM_WINDOW,  # INITIAL_WINDOW_SIZE
            0x5, MAX_FRAME,  # MAX_FRAME_SIZE
            0x6, self._limits.max_header_list_bytes,  # MAX_HEADER_LIST_SIZE
            0x2, 0,  # ENABLE_PUSH
        )  # fmt: skip
        return frame(SETTINGS, 0, 0, settings)

    def received(self, flags: int, sid: int, payload: bytes) -> None:
        """A SETTINGS frame from the client: applied, then acknowledged."""
        if sid != 0:
            raise Http2ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise Http2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self.acked = True
            return
        if len(payload) % 6:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        self.seen = True
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == 0x4:
                if value > MAX_WINDOW:
                    raise Http2ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                self._streams.initial_window(value)
            elif key == 0x2 and value > 1:
                raise Http2ConnectionError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            elif key == 0x1:  # SETTINGS_HEADER_TABLE_SIZE: the next header block says ours
                self._answers.table_update = True
            elif key == 0x5:
                if not 16384 <= value <= 16777215:
                    raise Http2ConnectionError(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self._answers.peer_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        if self._streams.peer_window > 0:
            self._answers.flush_all(self._streams.open)
