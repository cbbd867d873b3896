"""Property-based tests of the gRPC listener's HTTP/2 parsers: whatever bytes a client sends,
the HPACK decoder raises nothing but its protocol errors, and a connection ends anything it
cannot take with a GOAWAY, never with an internal error; blocks from a real encoder (hpack's,
its dynamic table resized on the way) decode to what was encoded."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from hpack import Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from milliserve.server.h2.frames import ACK, PREFACE, SETTINGS, frame
from milliserve.server.h2.h2_connection import Http2Protocol
from milliserve.server.h2.hpack_codec import HeaderBlockTooLarge, HpackDecoder, HpackError
from milliserve.server.h2.limits import ConnectionStats, Http2Limits
from milliserve.server.h2.stream import Stream
from milliserve.server.h2.turns import TurnBudget

LIMIT = 1 << 16
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

header_names = st.binary(min_size=1, max_size=40).map(lambda b: bytes(c | 0x20 for c in b))
header_lists = st.lists(st.tuples(header_names, st.binary(max_size=200)), max_size=12)


@FUZZ
@given(st.binary(max_size=600))
def test_any_bytes_decode_or_raise_a_protocol_error(block: bytes) -> None:
    decoder = HpackDecoder()
    try:
        headers = decoder.decode(block, LIMIT)
    except (HpackError, HeaderBlockTooLarge):
        return
    assert all(isinstance(n, bytes) and isinstance(v, bytes) for n, v in headers)


@FUZZ
@given(st.lists(st.tuples(header_lists, st.booleans(), st.sampled_from([None, 0, 256, 4096])), max_size=8))
def test_a_real_encoders_blocks_round_trip(blocks: list[tuple[list[tuple[bytes, bytes]], bool, Any]]) -> None:
    encoder, decoder = Encoder(), HpackDecoder()
    for headers, huffman, table in blocks:
        if table is not None:
            encoder.header_table_size = table
        assert decoder.decode(encoder.encode(headers, huffman=huffman), 1 << 24) == headers


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        self.closing = True

    close = abort

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


class _Handler:
    def open(self, conn: Any, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        pass

    def refuse_headers(self, conn: Any, stream: Stream, limit: int) -> None:
        pass

    def data(self, conn: Any, stream: Stream) -> None:
        pass

    def reset(self, stream: Stream) -> None:
        pass


class _Bugs(logging.Handler):
    """Records what the connection logs as a bug (an exception that is not a protocol error)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


frames = st.builds(
    frame,
    st.integers(0, 10),  # DATA .. CONTINUATION, and one unknown kind
    st.integers(0, 255),
    st.sampled_from([0, 1, 3, 5, 2, 0x7FFFFFFF]),
    st.binary(max_size=120),
)


def bugs_logged(sent: list[bytes], tail: bytes, cut: int) -> list[str]:
    """Feed a connection the preface, SETTINGS, ``sent`` and ``tail`` in pieces of ``cut``
    bytes; what it logged as a bug."""

    async def main() -> None:
        limits, stats = Http2Limits(), ConnectionStats()
        conn = Http2Protocol(_Handler(), limits, stats, lambda c: None, turns=TurnBudget())  # type: ignore[arg-type]
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        wire = PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0) + b"".join(sent) + tail
        for start in range(0, len(wire), cut):  # the bytes as they might come off the socket
            conn.data_received(wire[start : start + cut])
            await asyncio.sleep(0)
        conn.connection_lost(None)

    bugs = _Bugs()
    logger = logging.getLogger("milliserve.server.grpc")
    logger.addHandler(bugs)
    try:
        asyncio.run(main())
    finally:
        logger.removeHandler(bugs)
    return [r.getMessage() for r in bugs.records]


@FUZZ
@given(st.lists(frames, max_size=12), st.binary(max_size=40), st.integers(1, 50))
def test_a_connection_ends_what_it_cannot_take_with_a_goaway_never_a_bug(
    sent: list[bytes], tail: bytes, cut: int
) -> None:
    assert not bugs_logged(sent, tail, cut)


def test_settings_with_every_value_out_of_range_are_a_protocol_error_not_a_bug() -> None:
    values = struct.pack(">HLHLHL", 0x4, 0x80000000, 0x5, 1, 0x2, 7)
    assert not bugs_logged([frame(SETTINGS, 0, 0, values)], b"", 7)
