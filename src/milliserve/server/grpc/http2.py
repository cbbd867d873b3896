"""A server-side HTTP/2 connection (RFC 9113, cleartext with prior knowledge), made for gRPC.

grpcio could be made neither fast nor safe enough (docs/design.md, "gRPC on our own
HTTP/2"): its Python server crosses from grpc core's threads to the event loop for every
call, and its core cancels queued calls at random once more than
``grpc.server.max_pending_requests`` wait for that loop (CVE-2023-44487's honest twin).
This connection runs on the server's event loop, parses frames with ``struct``, decodes
headers through a per-connection cache (hpack_decoder.py) and writes a unary answer
(HEADERS, DATA, trailers) in one ``write``.

Every limit is per connection and enforced from its first byte (not after the client
acknowledges SETTINGS):
- concurrent streams (SETTINGS_MAX_CONCURRENT_STREAMS; a stream past it is refused);
- header list size, while decoding, and raw header bytes across CONTINUATION frames;
- streams reset by the client per second (Rapid Reset), control frames per second
  (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, RST_STREAM, empty DATA), and ping strikes:
  past any of them the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed;
- bytes held for answers the client does not read (a zero window, or a socket it does
  not read): past ``max_unread_bytes``, or older than ``unread_timeout_s``, the stream is
  reset and counted; a socket buffer past the limit closes the connection;
- receive windows: the client may have at most one message's worth per stream and two per
  connection in flight that the server has not taken up;
- the handshake, idle connections, keepalive pings, and connection age;
- the event loop itself: frames are parsed a slice per turn, and new streams are shared out
  between the connections per turn (turns.py), so no flood or burst holds the loop.

The gRPC layer (calls.py) sees a ``Stream`` per request and answers through ``respond``,
``send`` and ``finish``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from milliserve.server.grpc.frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEAD,
    HEADERS,
    INTERNAL_ERROR,
    MAX_FRAME,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    frame,
)
from milliserve.server.grpc.h2_headers import Http2Headers
from milliserve.server.grpc.h2_state import CONN_WINDOW, Http2Calm, Http2ConnectionError
from milliserve.server.grpc.turns import SLICE_FRAMES

log = logging.getLogger(__name__)

__all__ = ["Http2Protocol"]


class Http2Protocol(Http2Headers, asyncio.Protocol):
    """One client connection: its transport callbacks and the frames it reads (the state,
    sending and header blocks are in h2_state.py, h2_send.py and h2_headers.py)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        self.transport.set_write_buffer_limits(high=256 * 1024)
        settings = struct.pack(
            ">HLHLHLHLHL",
            0x3, self.limits.max_concurrent_streams,  # MAX_CONCURRENT_STREAMS
            0x4, self._stream_recv,  # INITIAL_WINDOW_SIZE
            0x5, MAX_FRAME,  # MAX_FRAME_SIZE
            0x6, self.limits.max_header_list_bytes,  # MAX_HEADER_LIST_SIZE
            0x2, 0,  # ENABLE_PUSH
        )  # fmt: skip
        grow = struct.pack(">L", CONN_WINDOW - DEFAULT_WINDOW)
        self._conn_recv = CONN_WINDOW
        self.transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, grow))
        self._timer = self._loop.call_later(1.0, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._budget.waiting.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._close_timer is not None:
            self._close_timer.cancel()
        for stream in list(self.streams.values()):
            self._drop(stream)
        self.streams.clear()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._on_close(self)

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
        if not self._settings_seen and kind != SETTINGS:
            raise Http2ConnectionError(PROTOCOL_ERROR, "the first frame was not SETTINGS")
        if self._headers_sid and kind != CONTINUATION:
            raise Http2ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            self._headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            # an honest client sends one for about every answer (10k a second at 8 threads of
            # grpcio): counted apart, with ten times the control-frame budget
            self._count_window()
            self._window_updates += 1
            if self._window_updates > 10 * self.limits.max_control_frames_per_s:
                raise Http2Calm(
                    f"more than {10 * self.limits.max_control_frames_per_s} WINDOW_UPDATE frames in a second"
                )
            self._window_update(sid, payload)
        else:
            self._control()
            if kind == RST_STREAM:
                self._rst(sid, payload)
            elif kind == SETTINGS:
                self._settings(flags, sid, payload)
            elif kind == PING:
                self._ping(flags, sid, payload)
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

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise Http2ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise Http2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self._settings_acked = True
            return
        if len(payload) % 6:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        self._settings_seen = True
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == 0x4:
                if value > MAX_WINDOW:
                    raise Http2ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_window
                self._peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise Http2ConnectionError(FLOW_CONTROL_ERROR, "a stream window past 2^31-1")
            elif key == 0x2 and value > 1:
                raise Http2ConnectionError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            elif key == 0x5:
                if not 16384 <= value <= 16777215:
                    raise Http2ConnectionError(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self._peer_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        if self._peer_window > 0:
            self._flush_all()

    def _ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise Http2ConnectionError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & ACK:
            self._keepalive_sent = 0.0
            return
        now = self._loop.time()
        # as grpc core: a ping soon after another, with no answer data sent between them, is
        # a strike; past max_ping_strikes the connection ends (ping floods, CVE-2019-9512)
        if not self._sent_data_since_ping and now - self._last_ping < self.limits.min_ping_interval_s:
            self._ping_strikes += 1
            if self._ping_strikes > self.limits.max_ping_strikes:
                raise Http2Calm("too_many_pings")  # the text grpc clients back off on
        elif self._sent_data_since_ping:
            self._ping_strikes = 0
        self._last_ping = now
        self._sent_data_since_ping = False
        self._write(frame(PING, ACK, 0, payload))

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        inc = struct.unpack(">L", payload)[0] & MAX_WINDOW
        if sid == 0:
            if inc == 0:
                raise Http2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += inc
            if self._send_window > MAX_WINDOW:
                raise Http2ConnectionError(FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self._flush_all()
            return
        if sid > self._last_id:
            raise Http2ConnectionError(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
        stream = self.streams.get(sid)
        if stream is None:
            return
        if inc == 0:
            self._reset(stream, PROTOCOL_ERROR)
            return
        stream.send_window += inc
        if stream.send_window > MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        self._flush(stream)

    def _rst(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if sid == 0 or sid > self._last_id:
            raise Http2ConnectionError(PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
        self.stats.resets_received += 1
        self._resets += 1  # _control() has started this second's count
        if self._resets > self.limits.max_resets_per_s:
            raise Http2Calm(f"more than {self.limits.max_resets_per_s} streams reset in a second")
        stream = self.streams.get(sid)
        if stream is not None:
            self._drop(stream)

    def _closing_by_peer(self) -> None:
        # the client goes away: finish what it asked for, take nothing new
        if not self.streams:
            self._close_soon()
        else:
            self.goaway_sent = True

    def _data(self, flags: int, sid: int, payload: bytes | memoryview) -> None:
        n = len(payload)
        self._conn_recv -= n
        if self._conn_recv < 0:
            raise Http2ConnectionError(FLOW_CONTROL_ERROR, "data past the connection window")
        self._conn_credit += n
        if self._conn_credit >= CONN_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", self._conn_credit)))
            self._conn_recv += self._conn_credit
            self._conn_credit = 0
        if flags & PADDED:
            if not payload or payload[0] >= n:
                raise Http2ConnectionError(PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : n - payload[0]]
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid == 0 or sid > self._last_id or stream is not None:
                code = STREAM_CLOSED if stream else PROTOCOL_ERROR
                raise Http2ConnectionError(code, "DATA on a closed stream")
            # a stream reset, refused or finished here: what was on the wire is dropped; tiny
            # frames count as control frames, as on open streams (an honest client's DATA in
            # flight after a refusal is a whole message, and a retry storm sends many)
            if len(payload) < 16:
                self._control()
            return
        if len(payload) < 16 and not flags & END_STREAM:
            # empty or tiny DATA frames are a flood of their own (CVE-2019-9518): a gRPC
            # message alone is 5 bytes of prefix and more
            self._control()
        stream.recv_window -= n
        if stream.recv_window < 0:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        stream.data += payload
        if flags & END_STREAM:
            stream.remote_closed = True
        self.handler.data(self, stream)
