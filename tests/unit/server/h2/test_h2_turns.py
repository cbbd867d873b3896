"""The HTTP/2 connection takes its turn on the event loop (issue 24, item 5): what one
``data_received`` parses is bounded (new streams over all connections per turn, frames per
connection), the rest waits with reading paused, and connections in line are served in
order, so that a good client's call is not parsed after thousands of an attacker's.

The connection is driven directly here, with a transport that records what it is told and
a stream handler that records the streams opened (the gRPC layer's side of the seam)."""

from __future__ import annotations

import asyncio
from typing import Any

from milliserve.server.h2.frames import ACK, DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS, frame
from milliserve.server.h2.h2_connection import Http2Protocol
from milliserve.server.h2.hpack_codec import literal
from milliserve.server.h2.limits import ConnectionStats, Http2Limits
from milliserve.server.h2.stream import Stream
from milliserve.server.h2.turns import SLICE_FRAMES, TURN_STREAMS, TurnBudget


class Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.reading = True
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

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

    def frames(self, kind: int) -> int:
        """How many frames of ``kind`` were written."""
        n, pos, out = 0, 0, bytes(self.out)
        while pos + 9 <= len(out):
            length = int.from_bytes(out[pos : pos + 3], "big")
            n += out[pos + 3] == kind
            pos += 9 + length
        return n


class Handler:
    def __init__(self) -> None:
        self.opened: list[tuple[int, int]] = []  # (connection, stream)

    def open(self, conn: Any, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        self.opened.append((id(conn), stream.id))

    def refuse_headers(self, conn: Any, stream: Stream, limit: int) -> None:
        pass

    def data(self, conn: Any, stream: Stream) -> None:
        pass

    def reset(self, stream: Stream) -> None:
        pass


_HEAD = b"".join(
    literal(k, v)
    for k, v in (
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
    )
)
_HELLO = PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0)


def _calls(n: int, first: int = 1) -> bytes:
    return b"".join(
        frame(HEADERS, END_HEADERS, sid, _HEAD) + frame(DATA, END_STREAM, sid, b"\0\0\0\0\0")
        for sid in range(first, first + 2 * n, 2)
    )


def _connection(handler: Handler, turns: TurnBudget) -> tuple[Http2Protocol, Transport]:
    limits = Http2Limits(max_concurrent_streams=1000)
    conn = Http2Protocol(handler, limits, ConnectionStats(), lambda c: None, turns=turns)  # type: ignore[arg-type]
    transport = Transport()
    conn.connection_made(transport)
    return conn, transport


async def _turn() -> None:
    await asyncio.sleep(0)


def test_a_burst_of_calls_is_opened_a_turn_at_a_time() -> None:
    async def main() -> None:
        handler, turns = Handler(), TurnBudget()
        conn, transport = _connection(handler, turns)
        conn.data_received(_HELLO + _calls(100))
        assert len(handler.opened) == TURN_STREAMS and not transport.reading
        await _turn()
        assert len(handler.opened) == 2 * TURN_STREAMS
        for _ in range(100 // TURN_STREAMS):
            await _turn()
        assert [sid for _, sid in handler.opened] == list(range(1, 200, 2))
        assert transport.reading
        conn.connection_lost(None)

    asyncio.run(main())


def test_a_connection_in_line_is_served_before_the_rest_of_a_burst() -> None:
    """a sends 200 calls, b one call just after: b's is opened on the next turn, while most
    of a's still wait."""

    async def main() -> None:
        handler, turns = Handler(), TurnBudget()
        a, _ = _connection(handler, turns)
        b, b_transport = _connection(handler, turns)
        a.data_received(_HELLO + _calls(200))
        b.data_received(_HELLO + _calls(1))
        assert (id(b), 1) not in handler.opened and not b_transport.reading  # this turn's budget is spent
        await _turn()
        assert (id(b), 1) in handler.opened
        assert sum(1 for c, _ in handler.opened if c == id(a)) < 100
        for conn in (a, b):
            conn.connection_lost(None)

    asyncio.run(main())


def test_a_flood_of_control_frames_is_parsed_a_slice_at_a_time() -> None:
    """1,000 SETTINGS frames (each acknowledged) in one read: a slice answered now, the rest
    on later turns."""

    async def main() -> None:
        conn, transport = _connection(Handler(), TurnBudget())
        conn.data_received(PREFACE + frame(SETTINGS, ACK, 0) + frame(SETTINGS, 0, 0) * 1000)
        assert transport.frames(SETTINGS) <= SLICE_FRAMES + 1 and not transport.reading
        for _ in range(1000 // SLICE_FRAMES + 1):
            await _turn()
        assert transport.reading
        assert transport.frames(SETTINGS) == 1001  # ours, and an acknowledgement for each
        conn.connection_lost(None)

    asyncio.run(main())
