"""The parts an HTTP/2 connection holds, each alone: its streams (streams.py), its receive
window (flow.py), pings (pings.py) and the SETTINGS exchange (peer_settings.py). Each is
given a clock, a list for what it writes, and a handler that records what the layer above
was told; the connection as a whole is driven in test_h2_turns.py and test_h2_fuzz.py."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from milliserve.server.h2.answers import Answers
from milliserve.server.h2.flow import CONN_WINDOW, ConnectionWindow
from milliserve.server.h2.frames import (
    ACK,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    HEAD,
    PING,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Http2Calm,
    Http2ConnectionError,
)
from milliserve.server.h2.header_blocks import HeaderBlock
from milliserve.server.h2.limits import ConnectionStats, FrameRates, Http2Limits
from milliserve.server.h2.peer_settings import PeerSettings
from milliserve.server.h2.pings import Pings
from milliserve.server.h2.stream import Stream
from milliserve.server.h2.streams import Streams


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Wire:
    """What a part wrote, as (type, flags, stream, payload) frames."""

    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        self.out += data

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        found, pos, out = [], 0, bytes(self.out)
        while pos < len(out):
            hi, lo, kind, flags, sid = HEAD.unpack_from(out, pos)
            n = (hi << 16) | lo
            found.append((kind, flags, sid, out[pos + 9 : pos + 9 + n]))
            pos += 9 + n
        return found


class Handler:
    def __init__(self) -> None:
        self.opened: list[int] = []
        self.reset_ids: list[int] = []

    def open(self, conn: Any, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        self.opened.append(stream.id)

    def refuse_headers(self, conn: Any, stream: Stream, limit: int) -> None:
        pass

    def data(self, conn: Any, stream: Stream) -> None:
        pass

    def reset(self, stream: Stream) -> None:
        self.reset_ids.append(stream.id)


class Parts:
    def __init__(self, limits: Http2Limits) -> None:
        self.clock = Clock()
        self.wire = Wire()
        self.handler = Handler()
        self.stats = ConnectionStats()
        self.drained = 0
        self.streams = Streams(
            None,
            self.handler,
            limits,
            self.stats,
            FrameRates(limits, self.clock),
            self.clock,
            write=self.wire.write,
            release=lambda stream: None,
            on_drained=self._drained,
        )

    def _drained(self) -> None:
        self.drained += 1

    def open(self, sid: int, flags: int = 0) -> None:
        self.streams.header_block(HeaderBlock(sid, flags, [], False, False, False))


def test_a_stream_past_the_concurrency_limit_is_refused_and_counted() -> None:
    parts = Parts(Http2Limits(max_concurrent_streams=2))
    for sid in (1, 3, 5):
        parts.open(sid)
    assert parts.handler.opened == [1, 3]
    assert parts.wire.frames() == [(RST_STREAM, 0, 5, struct.pack(">L", REFUSED_STREAM))]
    assert parts.stats.refused_streams == 1


def test_a_draining_connection_refuses_new_streams_and_closes_after_its_last() -> None:
    parts = Parts(Http2Limits())
    parts.open(1)
    parts.streams.draining = True
    parts.open(3)
    assert parts.handler.opened == [1]
    assert parts.wire.frames() == [(RST_STREAM, 0, 3, struct.pack(">L", REFUSED_STREAM))]
    assert parts.drained == 0
    parts.streams.rst(1, struct.pack(">L", 0))
    assert parts.handler.reset_ids == [1] and parts.drained == 1


def test_stream_errors_the_client_cannot_make() -> None:
    parts = Parts(Http2Limits())
    with pytest.raises(Http2ConnectionError) as idle:
        parts.streams.rst(7, struct.pack(">L", 0))
    assert idle.value.code == PROTOCOL_ERROR
    parts.open(3)
    with pytest.raises(Http2ConnectionError) as trailers:
        parts.open(3)  # trailers must end the request
    assert trailers.value.code == PROTOCOL_ERROR
    with pytest.raises(Http2ConnectionError) as closed:
        parts.open(1)  # below the highest stream opened: closed
    assert closed.value.code == STREAM_CLOSED
    parts.streams.data(0, 3, b"x" * (parts.streams.peer_window + 1))  # past its receive window
    assert parts.wire.frames()[-1] == (RST_STREAM, 0, 3, struct.pack(">L", FLOW_CONTROL_ERROR))
    assert parts.handler.reset_ids == [3]


def test_the_connection_window_is_given_back_at_half_and_never_overrun() -> None:
    wire = Wire()
    window = ConnectionWindow(wire.write)
    (kind, _, sid, payload) = _wrote(window.grow()).frames()[0]
    assert (kind, sid, struct.unpack(">L", payload)[0]) == (WINDOW_UPDATE, 0, CONN_WINDOW - 65535)
    window.received(CONN_WINDOW // 2 - 1)
    assert not wire.out
    window.received(1)
    assert wire.frames() == [(WINDOW_UPDATE, 0, 0, struct.pack(">L", CONN_WINDOW // 2))]
    with pytest.raises(Http2ConnectionError) as past:
        window.received(CONN_WINDOW + 1)
    assert past.value.code == FLOW_CONTROL_ERROR


def _wrote(data: bytes) -> Wire:
    wire = Wire()
    wire.write(data)
    return wire


class SentData:
    sent_data = False


def test_pings_without_answers_between_them_are_strikes() -> None:
    clock, wire = Clock(), Wire()
    pings = Pings(Http2Limits(max_ping_strikes=2), SentData(), clock, wire.write)  # type: ignore[arg-type]
    for _ in range(3):  # the first is not a strike: no ping came before it
        pings.received(0, 0, b"12345678")
    assert wire.frames()[-1] == (PING, ACK, 0, b"12345678")
    with pytest.raises(Http2Calm):
        pings.received(0, 0, b"12345678")
    with pytest.raises(Http2ConnectionError) as short:
        pings.received(0, 0, b"1234")
    assert short.value.code == FRAME_SIZE_ERROR


def test_a_keepalive_ping_unanswered_ends_the_connection() -> None:
    clock, wire = Clock(), Wire()
    limits = Http2Limits(keepalive_time_s=60.0, keepalive_timeout_s=20.0)
    pings = Pings(limits, SentData(), clock, wire.write)  # type: ignore[arg-type]
    last_recv = clock.now
    clock.now += 61
    assert pings.keepalive(clock.now, last_recv)
    assert wire.frames() == [(PING, 0, 0, b"keepaliv")]
    pings.received(ACK, 0, b"keepaliv")  # answered: the next one goes out a minute on
    clock.now += 61
    assert pings.keepalive(clock.now, last_recv) and len(wire.frames()) == 2
    clock.now += 21
    assert not pings.keepalive(clock.now, last_recv)


def test_the_clients_settings_move_the_open_streams_windows() -> None:
    limits = Http2Limits()
    parts = Parts(limits)
    loop: Any = None  # what is tested here schedules nothing
    answers = Answers(
        limits, parts.stats, loop, parts.wire.write, parts.streams.local_close, parts.streams.reset
    )
    settings = PeerSettings(limits, parts.streams, answers, parts.wire.write)
    parts.open(1, END_STREAM)
    settings.received(0, 0, struct.pack(">HL", 0x4, 1000) + struct.pack(">HL", 0x5, 32768))
    assert settings.seen and not settings.acked
    assert parts.streams.open[1].send_window == 1000 and answers.peer_frame == 32768
    assert parts.wire.frames()[-1] == (SETTINGS, ACK, 0, b"")
    for payload, code in (
        (struct.pack(">HL", 0x2, 2), PROTOCOL_ERROR),  # ENABLE_PUSH past 1
        (struct.pack(">HL", 0x4, 2**31), FLOW_CONTROL_ERROR),
        (struct.pack(">HL", 0x5, 100), PROTOCOL_ERROR),
        (b"\0" * 5, FRAME_SIZE_ERROR),
    ):
        with pytest.raises(Http2ConnectionError) as bad:
            settings.received(0, 0, payload)
        assert bad.value.code == code
    settings.received(ACK, 0, b"")
    assert settings.acked
