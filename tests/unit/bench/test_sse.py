"""The SSE parser reads the same events however the bytes are cut, and stamps each
with the arrival of its first byte."""

from __future__ import annotations

import pytest

from milliserve.bench.sse import SseEvent, SseParser

STREAM = (
    ": keep-alive\n\n"
    'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
    "event: ping\ndata: x\n\n"
    'data: {"a":\ndata: 1}\n\n'
    ":comment between events\n"
    "data:no-space\n\n"
    "data: [DONE]\n\n"
)
EXPECTED = [
    ('{"choices": [{"delta": {"content": "Hel"}}]}', "message"),
    ("x", "ping"),
    ('{"a":\n1}', "message"),
    ("no-space", "message"),
    ("[DONE]", "message"),
]


def parse(pieces: list[bytes]) -> list[SseEvent]:
    p = SseParser()
    out = []
    for i, piece in enumerate(pieces):
        out += p.feed(piece, float(i))
    return out + p.close(float(len(pieces)))


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_every_cut_point_gives_the_same_events(eol: str) -> None:
    raw = STREAM.replace("\n", eol).encode()
    whole = [(e.data, e.event) for e in parse([raw])]
    assert whole == EXPECTED
    for cut in range(1, len(raw)):
        events = parse([raw[:cut], raw[cut:]])
        assert [(e.data, e.event) for e in events] == EXPECTED, (eol, cut)


def test_byte_by_byte_with_crlf_split_between_reads() -> None:
    raw = STREAM.replace("\n", "\r\n").encode()
    assert [(e.data, e.event) for e in parse([raw[i : i + 1] for i in range(len(raw))])] == EXPECTED


def test_an_event_is_stamped_with_the_arrival_of_its_first_byte() -> None:
    p = SseParser()
    assert p.feed(b": keep-alive\n\nda", 1.0) == []  # the comment does not start the event
    assert p.feed(b"ta: one\n", 2.0) == []
    one, two = p.feed(b"\ndata: two\n\n", 3.0)
    assert one == SseEvent("one", 1.0)  # its first byte came with the first read
    assert two == SseEvent("two", 3.0)
    assert p.feed(b"data: three\n\n", 4.0) == [SseEvent("three", 4.0)]


def test_the_second_event_of_a_read_that_completes_the_first_is_stamped_then() -> None:
    p = SseParser()
    p.feed(b"data: one", 1.0)
    events = p.feed(b"\n\ndata: two\n\n", 2.0)
    assert [(e.data, e.t) for e in events] == [("one", 1.0), ("two", 2.0)]


def test_a_stream_that_ends_without_a_blank_line_still_yields_its_last_event() -> None:
    p = SseParser()
    assert p.feed(b"data: a\n\ndata: [DONE]", 1.0) == [SseEvent("a", 1.0)]
    assert p.close(2.0) == [SseEvent("[DONE]", 1.0)]


def test_blank_lines_and_fields_without_data_yield_nothing() -> None:
    p = SseParser()
    assert p.feed(b"\n\n\r\n: hi\n\nid: 7\nretry: 10\n\nevent: x\n\n", 1.0) == []
    assert p.feed(b"data: y\n\n", 2.0) == [SseEvent("y", 2.0)]  # the lone event: x did not stick
