"""One HTTP/1.1 connection with limits: uvicorn's httptools protocol plus a cap on the
request head, deadlines for the head, the body and idle keep-alive, and a cap on open
connections (issue 10: one 200 MiB header held the loop for 109 s; 20,000 silent
connections ran the process out of file descriptors).

The hot path stays as uvicorn's: one ``len()`` per received chunk and a few attribute
stores per request. Deadlines are not timers per request (``call_later`` costs ~1.7 µs
on uvloop): each connection keeps one deadline and one timer that fires at most every
``tick_s``, moves itself to the deadline when it has moved, and acts only when it has
passed. This also replaces uvicorn's keep-alive timer, which was armed and cancelled
on every request.

An error answer (431, 408) is followed by a half-close and a short linger that reads
and drops what the client still sends, so that the close does not reset the connection
before the client has read the answer (RFC 9112, section 9.6).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from milliserve.protocol.json_codec import encode_json
from milliserve.server.http.asgi import CANCEL_ON_DISCONNECT, CLIENT_GONE

__all__ = ["ConnectionLimits", "LimitedHttpToolsProtocol", "protocol_class"]

log = logging.getLogger(__name__)

# after an error answer, what the client still sends is read and dropped for at most this long
LINGER_S = 2.0
# a refused connection is logged at most this often per listener
_REFUSED_LOG_EVERY_S = 10.0

# what a connection is waiting for; the deadline belongs to it
_IDLE = 0  # a request to begin (just connected, or keep-alive after a response)
_HEAD = 1  # the rest of the request line and headers
_BODY = 2  # the rest of the body
_BUSY = 3  # nothing: the request is complete and the application answers it (no deadline)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The limits of one listener (from ``HttpSettings``)."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_s: float
    max_connections: int

    @property
    def keep_alive_header(self) -> tuple[str, str]:
        """``Keep-Alive: timeout=N``, whole seconds rounded down, so clients give up first."""
        return ("keep-alive", f"timeout={int(self.keep_alive_s)}")


def _answer(status: int, phrase: str, message: str) -> bytes:
    body = encode_json({"error": message})
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _HeadTooLarge(Exception):
    """Raised inside the parser's callback to stop it at once."""


class _Listener:
    """What the connections of one listener share: limits, prepared answers, refusal counts."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.tick_s = min(limits.header_timeout_s, limits.body_timeout_s, limits.keep_alive_s)
        self.too_large = _answer(
            431,
            "Request Header Fields Too Large",
            f"request line and headers are over the limit of {limits.max_header_bytes} bytes "
            "(max_header_bytes)",
        )
        self.head_timeout = _answer(
            408,
            "Request Timeout",
            f"request headers not complete within {limits.header_timeout_s:g} s (header_timeout_s)",
        )
        self.body_timeout = _answer(
            408,
            "Request Timeout",
            f"request body not complete within {limits.body_timeout_s:g} s (body_timeout_s)",
        )
        self.busy = _answer(
            503,
            "Service Unavailable",
            f"the server is at its limit of {limits.max_connections} open connections (max_connections)",
        )
        self.refused = 0
        self.refused_logged_at = -math.inf


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of ``listener`` (see ``protocol_class``)."""

    listener: _Listener

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = self.listener.limits
        self._max_head = limits.max_header_bytes
        self._header_timeout = limits.header_timeout_s
        self._body_timeout = limits.body_timeout_s
        self._keep_alive = limits.keep_alive_s
        self._phase = _IDLE
        self._head_bytes = 0
        self._deadline = math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._inflight: tuple[RequestResponseCycle, asyncio.Task[None]] | None = None

    # connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        listener = self.listener
        if len(self.connections) >= listener.limits.max_connections:
            self.transport = transport  # for connection_lost
            transport.write(listener.busy)
            transport.close()
            self._log_refused(listener)
            return
        super().connection_made(transport)
        self._deadline = self.loop.time() + self._header_timeout
        self._timer = self.loop.call_later(listener.tick_s, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        inflight = self._inflight
        super().connection_lost(exc)
        if inflight is not None:
            # nobody will read the answer: a route that asked for it stops computing it
            cycle, task = inflight
            if not cycle.response_complete and not task.done() and cycle.scope.get(CANCEL_ON_DISCONNECT):
                task.cancel(CLIENT_GONE)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        # as uvicorn's (without its reset_contextvars option, which milliserve does not set),
        # keeping the task of the request in flight
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._inflight = (cycle, task)

    def data_received(self, data: bytes) -> None:
        # as uvicorn's, with the head counted and without its keep-alive timer
        if self._phase != _BODY:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._refuse(self.listener.too_large)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        if self._phase != _BODY and self._head_bytes > self._max_head:
            self._refuse(self.listener.too_large)

    # parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEAD
        self._deadline = self.loop.time() + self._header_timeout
        if self._timer is None:
            self._timer = self.loop.call_later(self.listener.tick_s, self._on_timer)

    def on_headers_complete(self) -> None:
        # the bytes counted include what followed the head in the same chunk: measure
        # the head itself only when the count says it might be over
        if self._head_bytes > self._max_head and self._head_size() > self._max_head:
            raise _HeadTooLarge
        super().on_headers_complete()
        self._phase = _BODY
        self._deadline = self.loop.time() + self._body_timeout
        cycle = self.cycle
        if not cycle.keep_alive:
            cycle.default_headers = [h for h in cycle.default_headers if h[0] != b"keep-alive"]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0
        if self.cycle.response_complete:
            # answered before the body was read (a 413, say): the connection is idle now
            self._set_idle()
        else:
            self._phase = _BUSY
            self._deadline = math.inf

    def on_response_complete(self) -> None:
        # as uvicorn's, with the keep-alive deadline instead of a timer per request
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._phase == _BUSY:
            self._set_idle()

    # limits

    def _set_idle(self) -> None:
        self._phase = _IDLE
        self._deadline = self.loop.time() + self._keep_alive
        if self._timer is None:
            self._timer = self.loop.call_later(self.listener.tick_s, self._on_timer)

    def _head_size(self) -> int:
        # the request line and header lines as sent, give or take optional whitespace
        return len(self.url) + 16 + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _on_timer(self) -> None:
        self._timer = None
        if self._deadline == math.inf:
            return  # re-armed by the next request
        now = self.loop.time()
        if now < self._deadline:
            delay = min(self._deadline - now, self.listener.tick_s)
            self._timer = self.loop.call_later(delay, self._on_timer)
            return
        if self._phase == _IDLE:
            self.transport.close()
        elif self._phase == _HEAD:
            self._refuse(self.listener.head_timeout)
        elif self.flow.read_paused:
            # reading stopped on our side (the application has not taken the body yet, or
            # a pipelined request waits): not the client's delay
            self._deadline = now + self._body_timeout
            self._timer = self.loop.call_later(self.listener.tick_s, self._on_timer)
        else:
            self._refuse(self.listener.body_timeout)

    def _refuse(self, answer: bytes) -> None:
        """Answer ``answer`` and close, unless a response is already under way (then just close)."""
        cycle = self.cycle
        if self._phase == _BODY:
            # the request being read is ``cycle``'s, and its application waits for the body
            if cycle.response_started:
                self.transport.close()
                return
            cycle.disconnected = True
            cycle.message_event.set()
        elif cycle is not None and not cycle.response_complete:
            self.transport.close()  # the previous request is still being answered
            return
        transport = self.transport
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self.flow.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.connections.discard(self)
        transport.set_protocol(_Lingering(transport, self.connections, self.loop))

    def _log_refused(self, listener: _Listener) -> None:
        listener.refused += 1
        now = self.loop.time()
        if now - listener.refused_logged_at >= _REFUSED_LOG_EVERY_S:
            listener.refused_logged_at = now
            log.warning(
                "refused %d connection(s) on %s: at the limit of %d open connections (max_connections)",
                listener.refused,
                self.transport.get_extra_info("sockname"),
                listener.limits.max_connections,
            )
            listener.refused = 0


class _Lingering(asyncio.Protocol):
    """A refused connection after its answer: drops what the client still sends, and
    closes at the client's EOF or after ``LINGER_S``. Still counted as open."""

    def __init__(
        self, transport: asyncio.Transport, connections: set[Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.transport = transport
        self.connections = connections
        connections.add(self)
        self.timer = loop.call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.connections.discard(self)

    def shutdown(self) -> None:
        """Called by uvicorn when the server stops."""
        self.transport.close()


def protocol_class(limits: ConnectionLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for one listener (``uvicorn.Config(http=...)``); its connections
    share ``limits`` and the count of open connections."""

    class ListenerProtocol(LimitedHttpToolsProtocol):
        listener = _Listener(limits)

    return ListenerProtocol
