"""The send side of an HTTP/2 connection (RFC 9113 §5.2, §8.1): answers written as the
client's windows allow. A unary answer that fits goes out as HEADERS, DATA and trailers in
one write; what does not fit waits on its stream, bounded: past ``max_unread_bytes`` held
for a client that does not read, the stream is reset (CANCEL) and counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from milliserve.server.h2.frames import CANCEL, DATA, DEFAULT_WINDOW, END_HEADERS, END_STREAM, HEADERS, frame
from milliserve.server.h2.hpack_codec import TABLE_SIZE_ZERO
from milliserve.server.h2.limits import ConnectionStats, Http2Limits
from milliserve.server.h2.stream import Stream

__all__ = ["Answers"]

# a streamed answer's sender waits while more than this waits for its client
WRITABLE_BYTES = 256 * 1024


class Answers:
    """One connection's answers: the client's connection window (``window``), its largest
    frame (``peer_frame``), the bytes waiting for its windows (``held``), and whether answer
    data went out since the client's last PING (``sent_data``, for the ping strikes)."""

    __slots__ = (
        "_close",
        "_loop",
        "_reset",
        "_write",
        "held",
        "limits",
        "peer_frame",
        "sent_data",
        "stats",
        "table_update",
        "window",
    )

    def __init__(
        self,
        limits: Http2Limits,
        stats: ConnectionStats,
        loop: asyncio.AbstractEventLoop,
        write: Callable[[bytes], None],
        local_close: Callable[[Stream], None],
        reset: Callable[[Stream, int], None],
    ) -> None:
        self.limits = limits
        self.stats = stats
        self._loop = loop
        self._write = write
        self._close = local_close  # the answer is all sent
        self._reset = reset
        self.window = DEFAULT_WINDOW  # the client's connection window
        self.peer_frame = 16384
        self.held = 0
        self.sent_data = True
        # the client changed SETTINGS_HEADER_TABLE_SIZE: the next header block begins with a
        # dynamic table size update (RFC 7541 §4.2). Ours is always 0: the encoder writes
        # literals without indexing and never adds to the table
        self.table_update = False

    def _block(self, block: bytes) -> bytes:
        """A header block as it goes out: after a change of the client's table size, the
        first begins with the size update."""
        if self.table_update:
            self.table_update = False
            return TABLE_SIZE_ZERO + block
        return block

    def trailers_only(self, stream: Stream, block: bytes) -> None:
        """An answer without a body (an error before any response): one HEADERS frame."""
        self._write(frame(HEADERS, END_STREAM | END_HEADERS, stream.id, self._block(block)))
        self.sent_data = True
        self._close(stream)

    def respond(self, stream: Stream, head: bytes, body: bytes, trailers: bytes) -> None:
        """A whole answer: HEADERS, the body as DATA, trailers (as one write when the
        client's windows allow)."""
        if stream.local_closed:
            return
        stream.started = True
        n = len(body)
        if n <= stream.send_window and n <= self.window and n <= self.peer_frame and not stream.out:
            stream.send_window -= n
            self.window -= n
            self._write(
                frame(HEADERS, END_HEADERS, stream.id, self._block(head))
                + frame(DATA, 0, stream.id, body)
                + frame(HEADERS, END_STREAM | END_HEADERS, stream.id, trailers)
            )
            self.sent_data = True
            self._close(stream)
            return
        self._write(frame(HEADERS, END_HEADERS, stream.id, self._block(head)))
        stream.out_end = trailers
        self._queue(stream, body)

    def send(self, stream: Stream, head: bytes | None, body: bytes) -> None:
        """One message of a streamed answer (``head`` with the first)."""
        if stream.local_closed:
            return
        if head is not None and not stream.started:
            stream.started = True
            self._write(frame(HEADERS, END_HEADERS, stream.id, self._block(head)))
        self._queue(stream, body)

    def finish(self, stream: Stream, trailers: bytes) -> None:
        """The trailers of a streamed answer, after what is queued."""
        if stream.local_closed:
            return
        stream.out_end = trailers
        self.flush(stream)

    async def writable(self, stream: Stream, limit: int = WRITABLE_BYTES) -> None:
        """Wait while more than ``limit`` bytes of this stream's answer wait for its client."""
        while len(stream.out) > limit and not stream.local_closed:
            stream.waiter = self._loop.create_future()
            await stream.waiter

    def _queue(self, stream: Stream, body: bytes) -> None:
        if body:
            if not stream.out:
                stream.held_since = self._loop.time()
            stream.out += body
            self.held += len(body)
        self.flush(stream)
        if self.held > self.limits.max_unread_bytes and stream.out:
            self.stats.unread_cancelled += 1
            self._reset(stream, CANCEL)

    def flush(self, stream: Stream) -> None:
        """Send what of the stream's answer the windows allow (its trailers once all is sent)."""
        out = stream.out
        chunks: list[bytes] = []
        while out:
            n = min(len(out), stream.send_window, self.window, self.peer_frame)
            if n <= 0:
                break
            chunks.append(frame(DATA, 0, stream.id, bytes(out[:n])))
            del out[:n]
            stream.send_window -= n
            self.window -= n
            self.held -= n
        if not out:
            stream.held_since = 0.0
            if stream.out_end is not None:
                chunks.append(
                    frame(HEADERS, END_STREAM | END_HEADERS, stream.id, self._block(stream.out_end))
                )
        if chunks:
            self.sent_data = True
            self._write(b"".join(chunks))
        if not out and stream.out_end is not None:
            self._close(stream)
        elif stream.waiter is not None and not stream.waiter.done() and len(out) <= WRITABLE_BYTES:
            stream.waiter.set_result(None)

    def flush_all(self, streams: dict[int, Stream]) -> None:
        """The client's windows grew: send what waited, stream by stream."""
        for stream in list(streams.values()):
            if stream.out or stream.out_end is not None:
                self.flush(stream)
            if self.window <= 0:
                break

    def forget(self, stream: Stream) -> None:
        """A stream closed: its answer bytes are dropped."""
        self.held -= len(stream.out)
        stream.out.clear()
