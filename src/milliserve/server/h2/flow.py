"""Receive flow control (RFC 9113 §5.2): the window a connection grants its streams.

Every stream may send ``STREAM_WINDOW`` bytes before the server grants more; a message
larger than that asks for a grant when its 5-byte prefix arrives (``ReceiveGrants.want``),
and the grant goes back when the message is taken up (``consumed``). Grants are bounded per
connection (two messages' worth) and over all the connections of a listener together
(``GrantBudget``), so partial requests cannot fill the memory. A granted stream can always
finish its message (it has the window for all of it), so waiting for a grant never
deadlocks. The connection window is given back as data arrives (``ConnectionWindow``), so
one stalled stream never stops the others.

The send side (the client's windows, answers waiting for them) is answers.py's.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from milliserve.server.h2.frames import (
    DEFAULT_WINDOW,
    FLOW_CONTROL_ERROR,
    WINDOW_UPDATE,
    Http2ConnectionError,
    frame,
)
from milliserve.server.h2.stream import Stream

__all__ = ["CONN_WINDOW", "STREAM_WINDOW", "ConnectionWindow", "GrantBudget", "ReceiveGrants"]

# every stream may send this much before the server grants more (HTTP/2's default window)
STREAM_WINDOW = DEFAULT_WINDOW
# the connection's receive window, given back as data arrives
CONN_WINDOW = 16 * 1024 * 1024


class ConnectionWindow:
    """The connection's receive window: ``CONN_WINDOW`` from the start, given back with
    WINDOW_UPDATE once half of it has arrived, whether or not the streams took it up."""

    __slots__ = ("_credit", "_write", "left")

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self.left = DEFAULT_WINDOW  # what the client may still send
        self._credit = 0  # bytes received, not yet given back with WINDOW_UPDATE

    def grow(self) -> bytes:
        """The WINDOW_UPDATE that opens the window from HTTP/2's default to ``CONN_WINDOW``,
        sent with the server's SETTINGS."""
        self.left = CONN_WINDOW
        return frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", CONN_WINDOW - DEFAULT_WINDOW))

    def received(self, n: int) -> None:
        """A DATA frame of ``n`` bytes (padding included) arrived."""
        self.left -= n
        if self.left < 0:
            raise Http2ConnectionError(FLOW_CONTROL_ERROR, "data past the connection window")
        self._credit += n
        if self._credit >= CONN_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", self._credit)))
            self.left += self._credit
            self._credit = 0


class GrantBudget:
    """Receive window granted past each stream's first 64 KiB, over all the connections of a
    listener: when some goes back, the connections waiting for it are retried."""

    __slots__ = ("limit", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiting: set[ReceiveGrants] = set()  # connections with streams waiting for a grant

    def release(self, n: int) -> None:
        self.used -= n
        for grants in list(self.waiting):
            self.waiting.discard(grants)
            grants.retry()


class ReceiveGrants:
    """One connection's grants: given now if its share and the listener's budget allow, or
    in order once other streams have taken up their messages."""

    __slots__ = ("_budget", "_granted", "_limit", "_pending", "_streams", "_write")

    def __init__(
        self,
        budget: GrantBudget,
        max_message_bytes: int,
        streams: dict[int, Stream],
        write: Callable[[bytes], None],
    ) -> None:
        self._budget = budget
        self._streams = streams  # the connection's open streams
        self._write = write
        self._granted = 0  # this connection's share of the budget
        self._limit = 2 * (max_message_bytes + 5)
        self._pending: dict[Stream, int] = {}

    def want(self, stream: Stream, more: int) -> None:
        """The stream's current message needs ``more`` bytes still: grant the window for
        them, now if the budgets allow, or once other streams have finished theirs."""
        need = more - stream.recv_window
        if need <= 0 or stream.remote_closed or stream in self._pending:
            return
        if self._granted + need <= self._limit and self._budget.used + need <= self._budget.limit:
            self._grant(stream, need)
        else:
            self._pending[stream] = need
            self._budget.waiting.add(self)

    def _grant(self, stream: Stream, n: int) -> None:
        stream.granted += n
        stream.recv_window += n
        self._granted += n
        self._budget.used += n
        self._write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">L", n)))

    def retry(self) -> None:
        for stream, need in list(self._pending.items()):
            if stream.remote_closed or stream.id not in self._streams:
                del self._pending[stream]
            elif self._granted + need <= self._limit and self._budget.used + need <= self._budget.limit:
                del self._pending[stream]
                self._grant(stream, need)
            else:
                self._budget.waiting.add(self)
                return

    def _release(self, stream: Stream, n: int) -> None:
        n = min(n, stream.granted)
        if n > 0:
            stream.granted -= n
            self._granted -= n
            self._budget.release(n)
            self.retry()

    def consumed(self, stream: Stream, n: int) -> None:
        """A message of ``n`` bytes (prefix included) was taken up: its grant goes back to
        the budgets, and a stream still sending gets its first window back."""
        granted = min(n, stream.granted)
        self._release(stream, granted)
        restore = n - granted
        if restore > 0 and not stream.remote_closed and not stream.local_closed:
            stream.recv_window += restore
            self._write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">L", restore)))

    def forget(self, stream: Stream) -> None:
        """A stream closed: what it was granted or waited for goes back."""
        self._pending.pop(stream, None)
        self._release(stream, stream.granted)

    def close(self) -> None:
        """The connection is gone: it waits for nothing more."""
        self._budget.waiting.discard(self)
