"""A server-side HTTP/2 connection (RFC 9113, cleartext with prior knowledge), made for gRPC.

grpcio could be made neither fast nor safe enough (docs/design.md, "gRPC on our own
HTTP/2"): its Python server crosses from grpc core's threads to the event loop for every
call, and its core cancels queued calls at random once more than
``grpc.server.max_pending_requests`` wait for that loop (CVE-2023-44487's honest twin).
This connection runs on the server's event loop, parses frames with ``struct``, decodes
headers through a per-connection cache (hpack_codec.py) and writes a unary answer
(HEADERS, DATA, trailers) in one ``write``.

Every limit is per connection and enforced from its first byte (not after the client
acknowledges SETTINGS):
- concurrent streams (SETTINGS_MAX_CONCURRENT_STREAMS; a stream past it is refused:
  streams.py);
- header list size, while decoding, and raw header bytes across CONTINUATION frames
  (header_blocks.py);
- streams reset by the client per second (Rapid Reset), control frames per second
  (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, RST_STREAM, empty DATA), and ping strikes:
  past any of them the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed (limits.py,
  pings.py);
- bytes held for answers the client does not read (a zero window, or a socket it does
  not read): past ``max_unread_bytes``, or older than ``unread_timeout_s``, the stream is
  reset and counted; a socket buffer past the limit closes the connection;
- receive windows: the client may have at most one message's worth per stream and two per
  connection in flight that the server has not taken up (flow.py);
- the handshake (peer_settings.py), idle connections, keepalive pings (pings.py), and
  connection age, checked by the connection's timer each second;
- the event loop itself: frames are parsed a slice per turn, and new streams are shared out
  between the connections per turn (turns.py), so no flood or burst holds the loop.

The gRPC layer (server/grpc/calls.py) sees a ``Stream`` per request and answers through
``respond``, ``send`` and ``finish``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any

from milliserve.server.h2.answers import Answers
from milliserve.server.h2.flow import ConnectionWindow, GrantBudget, ReceiveGrants
from milliserve.server.h2.frames import (
    CANCEL,
    CONTINUATION,
    DATA,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEAD,
    HEADERS,
    INTERNAL_ERROR,
    MAX_FRAME,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    SETTINGS_TIMEOUT,
    WINDOW_UPDATE,
    Http2ConnectionError,
    frame,
)
from milliserve.server.h2.header_blocks import HeaderBlocks
from milliserve.server.h2.limits import ConnectionStats, FrameRates, Http2Limits
from milliserve.server.h2.peer_settings import PeerSettings
from milliserve.server.h2.pings import Pings
from milliserve.server.h2.stream import Stream, StreamHandler
from milliserve.server.h2.streams import Streams
from milliserve.server.h2.turns import SLICE_FRAMES, TurnBudget

log = logging.getLogger(__name__)

__all__ = ["Http2Protocol"]


class Http2Protocol(asyncio.Protocol):
    """One client connection: its transport callbacks, the frames it reads and hands to its
    parts, the client's windows for the answers, its timer, and how it ends. The parts:
    its streams (streams.py), header blocks (header_blocks.py), SETTINGS (peer_settings.py),
    pings (pings.py), receive windows (flow.py), answers (answers.py) and frame rates
    (limits.py)."""

    def __init__(
        self,
        handler: StreamHandler,
        limits: Http2Limits,
        stats: ConnectionStats,
        on_close: Callable[[Any], None],  # called with the connection
        budget: GrantBudget | None = None,
        turns: TurnBudget | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.stats = stats
        self._on_close = on_close
        self.transport: Any = None
        self.peer = ""
        self._buf = bytearray()
        self._preface = False
        self._turns = turns or TurnBudget()
        self._closing = False
        self._paused = False
        self._read_paused = False  # frames wait in _buf for this connection's turn (turns.py)
        self._drained: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._loop = loop = asyncio.get_running_loop()
        self._rates = FrameRates(limits, loop.time)
        self._streams = Streams(
            self,
            handler,
            limits,
            stats,
            self._rates,
            loop.time,
            write=self._write,
            release=self._forget,
            on_drained=self._close_soon,
        )
        self.streams = self._streams.open
        self._grants = ReceiveGrants(
            budget or GrantBudget(limits.max_buffered_bytes),
            limits.max_message_bytes,
            self.streams,
            self._write,
        )
        self._answers = Answers(
            limits, stats, loop, self._write, self._streams.local_close, self._streams.reset
        )
        self._window = ConnectionWindow(self._write)
        self._blocks = HeaderBlocks(limits.max_header_list_bytes, self._rates)
        self._settings = PeerSettings(limits, self._streams, self._answers, self._write)
        self._pings = Pings(limits, self._answers, loop.time, self._write)
        now = loop.time()
        self._born = now
        self._last_recv = now
        self._age_goaway_at = 0.0

    # ---- the transport ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        self.transport.set_write_buffer_limits(high=256 * 1024)
        self.transport.write(self._settings.ours() + self._window.grow())
        self._timer = self._loop.call_later(1.0, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._grants.close()
        if self._timer is not None:
            self._timer.cancel()
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._streams.drop_all()
        self.streams.clear()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._on_close(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False

    def _write(self, data: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(data)
        # a client that does not read its socket: what waits for it is bounded too
        if self._paused and t.get_write_buffer_size() > self.limits.max_unread_bytes:
            self.stats.unread_cancelled += len(self.streams)
            t.abort()

    # ---- reading ----
    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._last_recv = self._loop.time()
        self._buf += data
        if not self._read_paused:
            self.parse_more()

    def parse_more(self) -> None:
        """Parse the frames received, a slice at a time (turns.py): past its slice (frames,
        or the new streams ``TurnBudget`` gives it), the connection stops reading and waits
        in line with the listener's other connections for its next turn."""
        if self._closing:
            return
        buf = self._buf
        pos = 0
        if not self._preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(bytes(buf)):
                    self._abort()
                return
            if buf[: len(PREFACE)] != PREFACE:
                self._abort()
                return
            self._preface = True
            pos = len(PREFACE)
        end = len(buf)
        frames = streams = 0
        turns = self._turns
        share = min(turns.share, turns.left)
        more = False
        view = memoryview(buf)
        payload: bytes | memoryview = b""
        chunk: bytes | memoryview = b""
        try:
            while end - pos >= 9:
                hi, lo, kind, flags, sid = HEAD.unpack_from(buf, pos)
                if frames >= SLICE_FRAMES or (kind == HEADERS and streams >= share):
                    more = True
                    break
                length = (hi << 16) | lo
                if length > MAX_FRAME:
                    raise Http2ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - pos - 9 < length:
                    break
                # DATA is copied once, into its stream's buffer; other frames are kept whole
                chunk = view[pos + 9 : pos + 9 + length]
                payload = chunk if kind == DATA else bytes(chunk)
                pos += 9 + length
                frames += 1
                if kind == HEADERS:
                    streams += 1
                    turns.spend()
                self._frame(kind, flags, sid & MAX_WINDOW, payload)
                if self._closing:
                    return
        except Http2ConnectionError as exc:
            self._fail(exc.code, exc.reason)
            return
        except Exception:  # a bug: this connection ends, the others go on
            log.exception("HTTP/2 connection from %s failed", self.peer)
            self._fail(INTERNAL_ERROR, "internal error")
            return
        finally:
            payload = chunk = b""  # no view of the buffer outlives this call (it is resized)
            view.release()
        del buf[:pos]
        t = self.transport
        if more:
            if not self._read_paused:
                self._read_paused = True
                t.pause_reading()
            turns.wait(self)
        elif self._read_paused:
            self._read_paused = False
            if not t.is_closing():
                t.resume_reading()

    def _frame(self, kind: int, flags: int, sid: int, payload: Any) -> None:
        if not self._settings.seen and kind != SETTINGS:
            raise Http2ConnectionError(PROTOCOL_ERROR, "the first frame was not SETTINGS")
        if self._blocks.sid and kind != CONTINUATION:
            raise Http2ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._window.received(len(payload))
            self._streams.data(flags, sid, payload)
        elif kind == HEADERS:
            block = self._blocks.headers(flags, sid, payload)
            if block is not None:
                self._streams.header_block(block)
        elif kind == CONTINUATION:
            block = self._blocks.continuation(flags, sid, payload)
            if block is not None:
                self._streams.header_block(block)
        elif kind == WINDOW_UPDATE:
            self._rates.window_update()
            self._window_update(sid, payload)
        else:
            self._rates.control()
            if kind == RST_STREAM:
                self._streams.rst(sid, payload)
            elif kind == SETTINGS:
                self._settings.received(flags, sid, payload)
            elif kind == PING:
                self._pings.received(flags, sid, payload)
            elif kind == GOAWAY:
                if sid != 0:
                    raise Http2ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
                if len(payload) < 8:
                    raise Http2ConnectionError(FRAME_SIZE_ERROR, "GOAWAY too short")
                self._closing_by_peer()
            elif kind == PRIORITY:
                if sid == 0:
                    raise Http2ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
                if len(payload) != 5:
                    raise Http2ConnectionError(FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
            elif kind == PUSH_PROMISE:
                raise Http2ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
            # frames of unknown types are ignored (RFC 9113 §4.1), but counted above

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        inc = struct.unpack(">L", payload)[0] & MAX_WINDOW
        if sid == 0:
            if inc == 0:
                raise Http2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._answers.window += inc
            if self._answers.window > MAX_WINDOW:
                raise Http2ConnectionError(FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self._answers.flush_all(self.streams)
            return
        if sid > self._streams.last_id:
            raise Http2ConnectionError(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
        stream = self.streams.get(sid)
        if stream is None:
            return
        if inc == 0:
            self._streams.reset(stream, PROTOCOL_ERROR)
            return
        stream.send_window += inc
        if stream.send_window > MAX_WINDOW:
            self._streams.reset(stream, FLOW_CONTROL_ERROR)
            return
        self._answers.flush(stream)

    def _closing_by_peer(self) -> None:
        # the client goes away: finish what it asked for, take nothing new
        if not self.streams:
            self._close_soon()
        else:
            self._streams.draining = True

    # ---- receive grants (flow.py), for the layer above ----
    def want(self, stream: Stream, more: int) -> None:
        """The stream's current message needs ``more`` bytes still (``ReceiveGrants.want``)."""
        self._grants.want(stream, more)

    def consumed(self, stream: Stream, n: int) -> None:
        """A message of ``n`` bytes (prefix included) was taken up (``ReceiveGrants.consumed``)."""
        self._grants.consumed(stream, n)

    # ---- answers (answers.py), for the layer above ----
    def trailers_only(self, stream: Stream, block: bytes) -> None:
        """An answer without a body (an error before any response): one HEADERS frame."""
        self._answers.trailers_only(stream, block)

    def respond(self, stream: Stream, head: bytes, body: bytes, trailers: bytes) -> None:
        """A whole answer: HEADERS, the body as DATA, trailers (``Answers.respond``)."""
        self._answers.respond(stream, head, body, trailers)

    def send(self, stream: Stream, head: bytes | None, body: bytes) -> None:
        """One message of a streamed answer (``head`` with the first)."""
        self._answers.send(stream, head, body)

    def finish(self, stream: Stream, trailers: bytes) -> None:
        """The trailers of a streamed answer, after what is queued."""
        self._answers.finish(stream, trailers)

    async def writable(self, stream: Stream, limit: int = 256 * 1024) -> None:
        """Wait while more than ``limit`` bytes of this stream's answer wait for its client."""
        await self._answers.writable(stream, limit)

    # ---- closed streams (streams.py) ----
    def _forget(self, stream: Stream) -> None:
        """Let go of what a closed stream holds: its answer bytes, its request bytes, its grant."""
        self._answers.forget(stream)
        stream.data.clear()
        self._grants.forget(stream)

    # ---- ending the connection ----
    def goaway(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        """Take no new stream; with NO_ERROR the open ones finish first."""
        if self._streams.draining and code == NO_ERROR:
            return
        self._streams.draining = True
        self._write(frame(GOAWAY, 0, 0, struct.pack(">LL", self._streams.last_id, code) + debug[:256]))
        if code != NO_ERROR:
            self._linger()
        elif not self.streams:
            self._close_soon()

    def _fail(self, code: int, reason: str) -> None:
        if code == ENHANCE_YOUR_CALM:
            self.stats.goaway_calm += 1
        else:
            self.stats.protocol_errors += 1
        self._streams.drop_all()
        self.goaway(code, reason.encode()[:200])

    def close(self) -> None:
        """Stop now: the calls still running are cancelled."""
        self._streams.drop_all()
        self._abort()

    async def drain(self) -> None:
        """Wait until the connection has closed (after a graceful ``goaway``)."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._drained is None:
            self._drained = self._loop.create_future()
        await self._drained

    def _linger(self) -> None:
        """Close after an error without losing the GOAWAY: closing a socket with unread
        bytes sends RST, and the client may then never read the GOAWAY. So stop reading
        (a flooding client's writes block, costing nothing here), send FIN after what is
        buffered, and abort two seconds later."""
        self._closing = True
        t = self.transport
        if t is None or t.is_closing():
            return
        t.pause_reading()
        if t.can_write_eof():
            t.write_eof()
        self._loop.call_later(2.0, t.abort)

    def _close_soon(self) -> None:
        """Close a second after a graceful GOAWAY, once no call is left: a client may have
        sent a new call before it read the GOAWAY. Meanwhile such calls are refused
        (REFUSED_STREAM, which clients retry on a new connection) rather than lost with the
        socket."""
        if self._close_timer is None and not self._closing:
            self._close_timer = self._loop.call_later(1.0, self._finish_close)

    def _finish_close(self) -> None:
        """Close without a reset: closing a socket with bytes unread sends RST, and the
        client would see 'connection reset' instead of the GOAWAY. So: FIN after what is
        buffered, drop what still comes, and abort 2 s later if the client has not closed."""
        self._closing = True
        t = self.transport
        if t is None or t.is_closing():
            return
        if not t.can_write_eof():
            t.close()
            return
        t.write_eof()
        self._loop.call_later(2.0, t.abort)

    def _abort(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    def _tick(self) -> None:
        now = self._loop.time()
        lim = self.limits
        self._timer = self._loop.call_later(1.0, self._tick)
        if not self._preface or not self._settings.seen:
            if now - self._born > lim.handshake_timeout_s:
                self._abort()
            return
        if not self._settings.acked and now - self._born > lim.handshake_timeout_s:
            self._fail(SETTINGS_TIMEOUT, "SETTINGS not acknowledged")
            return
        if not self._pings.keepalive(now, self._last_recv):
            self._abort()  # the peer vanished without a FIN
            return
        if not self.streams and now - self._streams.last_active > lim.idle_timeout_s:
            self.goaway(NO_ERROR, b"idle")
        if lim.max_connection_age_s and now - self._born > lim.max_connection_age_s:
            if not self._streams.draining:
                self._age_goaway_at = now
                self.goaway(NO_ERROR, b"max connection age")
            elif self._age_goaway_at and now - self._age_goaway_at > lim.connection_age_grace_s:
                self.close()
                return
        for stream in list(self.streams.values()):
            if stream.held_since and now - stream.held_since > lim.unread_timeout_s:
                self.stats.unread_cancelled += 1
                self._streams.reset(stream, CANCEL)
            elif (
                not stream.remote_closed
                and stream.call is not None
                and stream.call.unary
                and now - stream.opened > lim.request_timeout_s
            ):
                self._streams.reset(stream, CANCEL)  # a unary request that never finishes arriving
