"""The server's own clock on each HTTP request, for benchmarks (off unless
``MILLISERVE_HTTP__WIRE_TIMING_FILE`` names a file).

Two load generators that disagree about a latency need a third witness that is neither of
them: the server itself. With the option on, every HTTP request on the main port records two
instants of ``time.monotonic()`` (CLOCK_MONOTONIC, the same clock every process of the machine
reads, so a client's own timestamps line up with these): when the event loop handed the
server the request's first bytes, and when its answer was handed to the kernel (the instant
before the ``transport.write`` of the whole answer: read after it, a busy machine may run the
client, woken by the answer, before this thread reads the clock). The pairs are appended to the file as
float64 (first byte, written) every 250 ms and at stop; ``read_wire_log`` reads them back.

What it does not see: the time a request's bytes waited in the kernel before the loop woke
to read them, and the time its answer spends on the way back. A client-side figure is this
span plus those, plus the client's own delays; the span is the part that is the server's.

Meant for one request in flight per connection (what load generators do): a connection that
pipelines requests, or gets a ``100 Continue``, has its spans cut at the first write.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["WireLog", "read_wire_log", "timed_protocol"]

FLUSH_S = 0.25


class WireLog:
    """The (first byte, written) pairs of one server, appended to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = array("d")
        self._file: Any = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab", buffering=0)
        self._schedule()

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._tick)

    def _tick(self) -> None:
        self.flush()
        self._schedule()

    def add(self, first: float, written: float) -> None:
        self.rows.append(first)
        self.rows.append(written)

    def flush(self) -> None:
        if self.rows and self._file is not None:
            self._file.write(self.rows.tobytes())  # a few kB: one write, no fsync
            self.rows = array("d")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def read_wire_log(path: Path) -> np.ndarray[Any, Any]:
    """The pairs written so far: an array of shape (n, 2), first byte and written instants."""
    raw = path.read_bytes() if path.exists() else b""
    return np.frombuffer(raw[: len(raw) // 16 * 16], dtype=np.float64).reshape(-1, 2)


class _TimedTransport:
    """The connection's transport, with each answer's write timed; all else passes through."""

    __slots__ = ("_conn", "_log", "_transport")

    def __init__(self, transport: Any, conn: Any, log: WireLog) -> None:
        self._transport, self._conn, self._log = transport, conn, log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        conn = self._conn
        if conn.wire_first is not None:
            # read before the write: once the bytes are in the kernel the client may run (and
            # on a busy machine take this CPU) before this thread reads the clock again
            self._log.add(conn.wire_first, time.monotonic())
            conn.wire_first = None
        self._transport.write(data)


def timed_protocol(cls: type[Any], log: WireLog) -> type[Any]:
    """``cls`` (the HTTP protocol class of a listener) with its requests timed into ``log``."""

    class Timed(cls):  # type: ignore[misc]
        wire_first: float | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(_TimedTransport(transport, self, log))

        def data_received(self, data: bytes) -> None:
            if self.wire_first is None:
                self.wire_first = time.monotonic()
            super().data_received(data)

    return Timed
