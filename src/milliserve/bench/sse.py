"""An incremental Server-Sent Events parser for a client that times each event.

Bytes arrive in whatever pieces TCP and the server's writes make: an event may be
split across reads, several may come in one, lines may end in LF, CRLF or CR (a CRLF
may even be split between two reads), and comment lines (``: keep-alive``) may come
between events. ``SseParser.feed`` takes each piece with the instant it arrived and
returns the events it completed, each stamped with the arrival of *its first byte*:
that is when the server sent the token, whatever the size of the event.

The rules are the WHATWG ``text/event-stream`` ones, less ``id`` and ``retry``
(a benchmark does not reconnect).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SseEvent", "SseParser"]


@dataclass(frozen=True, slots=True)
class SseEvent:
    data: str  # the event's data lines joined by "\n"
    t: float  # when its first byte arrived (the instant given to ``feed``)
    event: str = "message"


class SseParser:
    def __init__(self) -> None:
        self._line = bytearray()  # the unfinished line
        self._skip_lf = False  # the last piece ended in CR: an LF starting the next belongs to it
        self._data: list[str] = []
        self._event = ""
        self._started: float | None = None  # arrival of the first byte of the event being read

    def feed(self, chunk: bytes, now: float) -> list[SseEvent]:
        """Parse ``chunk`` (received at ``now``); returns the events it completed."""
        out: list[SseEvent] = []
        i, n = 0, len(chunk)
        if self._skip_lf and n and chunk[0] == 0x0A:
            i = 1
        self._skip_lf = False
        while i < n:
            cr, lf = chunk.find(b"\r", i), chunk.find(b"\n", i)
            ends = [e for e in (cr, lf) if e >= 0]
            if not ends:
                self._begin(now)
                self._line += chunk[i:]
                break
            end = min(ends)
            if end > i or self._line:
                self._begin(now)
            self._line += chunk[i:end]
            line = bytes(self._line)
            self._line.clear()
            if chunk[end] == 0x0D:
                if end + 1 == n:
                    self._skip_lf = True
                    i = n
                else:
                    i = end + 2 if chunk[end + 1] == 0x0A else end + 1
            else:
                i = end + 1
            event = self._line_done(line)
            if event is not None:
                out.append(event)
        return out

    def close(self, now: float) -> list[SseEvent]:
        """End of stream: an event the server did not close with a blank line still counts
        (some servers end on ``data: [DONE]`` without one)."""
        out = []
        if self._line:
            event = self._line_done(bytes(self._line))
            self._line.clear()
            if event is not None:
                out.append(event)
        event = self._line_done(b"")
        if event is not None:
            out.append(event)
        return out

    def _begin(self, now: float) -> None:
        if self._started is None:
            self._started = now

    def _line_done(self, line: bytes) -> SseEvent | None:
        if not line:  # a blank line dispatches the event
            started, self._started = self._started, None
            if not self._data:
                self._event = ""
                return None
            event = SseEvent("\n".join(self._data), started or 0.0, self._event or "message")
            self._data, self._event = [], ""
            return event
        if line[:1] == b":":  # a comment (keep-alive): no part of any event
            if not self._data and not self._event:
                self._started = None
            return None
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        text = value.decode("utf-8", errors="replace")
        if name == b"data":
            self._data.append(text)
        elif name == b"event":
            self._event = text
        elif not self._data and not self._event:
            self._started = None  # id, retry or an unknown field alone does not start an event
        return None
