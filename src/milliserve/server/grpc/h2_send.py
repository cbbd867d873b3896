"""The sending half of an HTTP/2 connection (http2.py): grants, answers, resets."""

from __future__ import annotations

import struct

from milliserve.server.grpc.frames import (
    CANCEL,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    NO_ERROR,
    PING,
    RST_STREAM,
    SETTINGS_TIMEOUT,
    WINDOW_UPDATE,
    Stream,
    frame,
)
from milliserve.server.grpc.h2_state import Http2State

__all__ = ["Http2Sending"]


class Http2Sending(Http2State):
    """A connection's answers and receive grants: windows granted per message within the
    connection's and the listener's budgets, answers written as the client's windows allow
    (what waits for a client that does not read is bounded), streams closed and reset."""

    def want(self, stream: Stream, more: int) -> None:
        """The stream's current message needs ``more`` bytes still: grant the window for
        them, now if the budgets allow, or once other streams have finished theirs."""
        need = more - stream.recv_window
        if need <= 0 or stream.remote_closed or stream in self._pending_grants:
            return
        if self._granted + need <= self._grant_limit and self._budget.used + need <= self._budget.limit:
            self._grant(stream, need)
        else:
            self._pending_grants[stream] = need
            self._budget.waiting.add(self)

    def _grant(self, stream: Stream, n: int) -> None:
        stream.granted += n
        stream.recv_window += n
        self._granted += n
        self._budget.used += n
        self._write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">L", n)))

    def retry_grants(self) -> None:
        for stream, need in list(self._pending_grants.items()):
            if stream.remote_closed or stream.id not in self.streams:
                del self._pending_grants[stream]
            elif self._granted + need <= self._grant_limit and self._budget.used + need <= self._budget.limit:
                del self._pending_grants[stream]
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
            self.retry_grants()

    def consumed(self, stream: Stream, n: int) -> None:
        """A message of ``n`` bytes (prefix included) was taken up: its grant goes back to
        the budgets, and a stream still sending gets its first window back."""
        granted = min(n, stream.granted)
        self._release(stream, granted)
        restore = n - granted
        if restore > 0 and not stream.remote_closed and not stream.local_closed:
            stream.recv_window += restore
            self._write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">L", restore)))

    def trailers_only(self, stream: Stream, block: bytes) -> None:
        """An answer without a body (an error before any response): one HEADERS frame."""
        self._write(frame(HEADERS, END_STREAM | END_HEADERS, stream.id, block))
        self._sent_data_since_ping = True
        self._local_close(stream)

    def respond(self, stream: Stream, head: bytes, body: bytes, trailers: bytes) -> None:
        """A whole answer: HEADERS, the body as DATA, trailers (as one write when the
        client's windows allow)."""
        if stream.local_closed:
            return
        stream.started = True
        n = len(body)
        if n <= stream.send_window and n <= self._send_window and n <= self._peer_frame and not stream.out:
            stream.send_window -= n
            self._send_window -= n
            self._write(
                frame(HEADERS, END_HEADERS, stream.id, head)
                + frame(DATA, 0, stream.id, body)
                + frame(HEADERS, END_STREAM | END_HEADERS, stream.id, trailers)
            )
            self._sent_data_since_ping = True
            self._local_close(stream)
            return
        self._write(frame(HEADERS, END_HEADERS, stream.id, head))
        stream.out_end = trailers
        self._queue(stream, body)

    def send(self, stream: Stream, head: bytes | None, body: bytes) -> None:
        """One message of a streamed answer (``head`` with the first)."""
        if stream.local_closed:
            return
        if head is not None and not stream.started:
            stream.started = True
            self._write(frame(HEADERS, END_HEADERS, stream.id, head))
        self._queue(stream, body)

    def finish(self, stream: Stream, trailers: bytes) -> None:
        """The trailers of a streamed answer, after what is queued."""
        if stream.local_closed:
            return
        stream.out_end = trailers
        self._flush(stream)

    async def writable(self, stream: Stream, limit: int = 256 * 1024) -> None:
        """Wait while more than ``limit`` bytes of this stream's answer wait for its client."""
        while len(stream.out) > limit and not stream.local_closed:
            stream.waiter = self._loop.create_future()
            await stream.waiter

    def _queue(self, stream: Stream, body: bytes) -> None:
        if body:
            if not stream.out:
                stream.held_since = self._loop.time()
            stream.out += body
            self._held += len(body)
        self._flush(stream)
        if self._held > self.limits.max_unread_bytes and stream.out:
            self.stats.unread_cancelled += 1
            self._reset(stream, CANCEL)

    def _flush(self, stream: Stream) -> None:
        out = stream.out
        chunks: list[bytes] = []
        while out:
            n = min(len(out), stream.send_window, self._send_window, self._peer_frame)
            if n <= 0:
                break
            chunks.append(frame(DATA, 0, stream.id, bytes(out[:n])))
            del out[:n]
            stream.send_window -= n
            self._send_window -= n
            self._held -= n
        if not out:
            stream.held_since = 0.0
            if stream.out_end is not None:
                chunks.append(frame(HEADERS, END_STREAM | END_HEADERS, stream.id, stream.out_end))
        if chunks:
            self._sent_data_since_ping = True
            self._write(b"".join(chunks))
        if not out and stream.out_end is not None:
            self._local_close(stream)
        elif stream.waiter is not None and not stream.waiter.done() and len(out) <= 256 * 1024:
            stream.waiter.set_result(None)

    def _flush_all(self) -> None:
        for stream in list(self.streams.values()):
            if stream.out or stream.out_end is not None:
                self._flush(stream)
            if self._send_window <= 0:
                break

    def _local_close(self, stream: Stream) -> None:
        stream.local_closed = True
        if stream.waiter is not None and not stream.waiter.done():
            stream.waiter.set_result(None)
        if not stream.remote_closed:
            # answered before the request ended (an error): tell the client to stop sending
            self._write(frame(RST_STREAM, 0, stream.id, struct.pack(">L", NO_ERROR)))
            stream.remote_closed = True
        self._forget(stream)
        self.streams.pop(stream.id, None)
        self._last_active = self._loop.time()
        if self.goaway_sent and not self.streams:
            self._close_soon()

    def _forget(self, stream: Stream) -> None:
        """Let go of what a closed stream holds: its answer bytes, its request bytes, its grant."""
        self._held -= len(stream.out)
        stream.out.clear()
        stream.data.clear()
        self._pending_grants.pop(stream, None)
        self._release(stream, stream.granted)

    def _reset(self, stream: Stream, code: int) -> None:
        """Reset a stream from the server's side (and stop its call)."""
        self._write(frame(RST_STREAM, 0, stream.id, struct.pack(">L", code)))
        self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        if stream.local_closed and stream.id not in self.streams:
            return
        stream.local_closed = stream.remote_closed = True
        self._forget(stream)
        if stream.waiter is not None and not stream.waiter.done():
            stream.waiter.set_result(None)
        self.streams.pop(stream.id, None)
        self.handler.reset(stream)
        if self.goaway_sent and not self.streams:
            self._close_soon()

    def _fail(self, code: int, reason: str) -> None:
        if code == ENHANCE_YOUR_CALM:
            self.stats.goaway_calm += 1
        else:
            self.stats.protocol_errors += 1
        for stream in list(self.streams.values()):
            self._drop(stream)
        self.goaway(code, reason.encode()[:200])

    def close(self) -> None:
        """Stop now: the calls still running are cancelled."""
        for stream in list(self.streams.values()):
            self._drop(stream)
        self._abort()

    def _tick(self) -> None:
        now = self._loop.time()
        lim = self.limits
        self._timer = self._loop.call_later(1.0, self._tick)
        if not self._preface or not self._settings_seen:
            if now - self._born > lim.handshake_timeout_s:
                self._abort()
            return
        if not self._settings_acked and now - self._born > lim.handshake_timeout_s:
            self._fail(SETTINGS_TIMEOUT, "SETTINGS not acknowledged")
            return
        if self._keepalive_sent and now - self._keepalive_sent > lim.keepalive_timeout_s:
            self._abort()  # the peer vanished without a FIN
            return
        if not self._keepalive_sent and now - self._last_recv > lim.keepalive_time_s:
            self._keepalive_sent = now
            self._write(frame(PING, 0, 0, b"keepaliv"))
        if not self.streams and now - self._last_active > lim.idle_timeout_s:
            self.goaway(NO_ERROR, b"idle")
        if lim.max_connection_age_s and now - self._born > lim.max_connection_age_s:
            if not self.goaway_sent:
                self._age_goaway_at = now
                self.goaway(NO_ERROR, b"max connection age")
            elif self._age_goaway_at and now - self._age_goaway_at > lim.connection_age_grace_s:
                self.close()
                return
        for stream in list(self.streams.values()):
            if stream.held_since and now - stream.held_since > lim.unread_timeout_s:
                self.stats.unread_cancelled += 1
                self._reset(stream, CANCEL)
            elif (
                not stream.remote_closed
                and stream.call is not None
                and stream.call.unary
                and now - stream.opened > lim.request_timeout_s
            ):
                self._reset(stream, CANCEL)  # a unary request that never finishes arriving
