"""One HTTP/1.1 connection, purpose-built: httptools parses, this protocol keeps the
limits, and each request is handed to the ASGI application with a ``Cycle`` that writes
its response in one piece (``server/http/cycle.py``); what a listener's connections share,
its limits and prepared answers, is in ``server/http/listener.py``.

Why not uvicorn's protocol (which this one replaced; its server loop went later, for
``server/http/server.py``): a tiny
model's whole request costs less than uvicorn's per-request work around it: an
``asyncio.Event``, a header regex per header, two writes per response (the head, then the
body: two syscalls and two wake-ups of the client), the proxy-headers middleware. The
measurements are in docs/benchmarks.md ("server-overhead").

The limits (issue 10: one 200 MiB header held the loop for 109 s; 20,000 silent
connections ran the process out of file descriptors): a cap on the request head,
deadlines for the head, the body and idle keep-alive, and a cap on open connections.
Deadlines are not timers per request (``call_later`` costs ~1.7 µs on uvloop): each
connection keeps one deadline and one timer that fires at most every ``tick_s``, moves
itself to the deadline when it has moved, and acts only when it has passed.

An error answer (400, 431, 408) is followed by a half-close and a short linger that reads
and drops what the client still sends, so that the close does not reset the connection
before the client has read the answer (RFC 9112, section 9.6).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import urllib.parse
from collections import deque
from typing import TYPE_CHECKING, Any, cast

import httptools

from milliserve.server.eager import eager_route, start_eager
from milliserve.server.http.asgi import CANCEL_ON_DISCONNECT, CLIENT_GONE
from milliserve.server.http.cycle import Cycle
from milliserve.server.http.listener import Lingering, Listener

if TYPE_CHECKING:
    from milliserve.server.http.server import HttpServer

__all__ = ["HttpProtocol"]

log = logging.getLogger(__name__)

# when the server stops, an idle keep-alive connection is closed after this much silence
DRAIN_IDLE_S = 1.0
# a refused connection is logged at most this often per listener
_REFUSED_LOG_EVERY_S = 10.0
# body bytes held for an application that has not read them yet, before reading pauses
_HIGH_WATER = 65536
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH")}

# what a connection is waiting for; the deadline belongs to it
_IDLE = 0  # a request to begin (just connected, or keep-alive after a response)
_HEAD = 1  # the rest of the request line and headers
_BODY = 2  # the rest of the body
_BUSY = 3  # nothing: the request is complete and the application answers it (no deadline)


def _address(addr: Any) -> tuple[str, int] | None:
    return (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) and len(addr) >= 2 else None


class _HeadTooLarge(Exception):
    """Raised inside the parser's callback to stop it at once."""


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection of ``server`` (``server/http/server.py``), with its
    listener's limits: requests are parsed by httptools into ASGI scopes here, and each
    one's response is written by a ``Cycle`` (``server/http/cycle.py``). ``shutdown()`` is
    the server's graceful stop, told to each connection.
    """

    def __init__(self, server: HttpServer) -> None:
        self.server_of = server
        self.app = server.app
        self.express = server.express
        self.listener: Listener = server.listener
        self.loop = asyncio.get_running_loop()
        self.connections: set[Any] = server.connections
        self.tasks: set[asyncio.Task[None]] = server.tasks
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3
            # answer the first of pipelined requests that arrive with a close
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.default_head, self.close_head = server.default_head, server.close_head
        limits = self.listener.limits
        self._max_head = limits.max_header_bytes
        self._header_timeout = limits.header_timeout_s
        self._body_timeout = limits.body_timeout_s
        self._keep_alive = limits.keep_alive_s
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        # the request being parsed, the one being answered, and those parsed in between
        self.cycle: Cycle | None = None
        self._running: tuple[Cycle, asyncio.Task[None]] | None = None
        self._pipeline: deque[Cycle] = deque()
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        # per request, while parsing
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_continue = False
        self._body_size = -1  # Content-Length: -1 none, -2 chunked
        self._deferred: Cycle | None = None  # started once its body is in (``_defer``)
        self._phase = _IDLE
        self._head_bytes = 0
        self._deadline = math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False  # the server is stopping: no request after the next

    # ---- connection ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = transport = cast(asyncio.Transport, transport)
        self.server_of.unmade.discard(self)
        listener = self.listener
        if len(self.connections) >= listener.limits.max_connections:
            transport.write(listener.busy)
            transport.close()
            self._log_refused(listener)
            return
        self.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self._deadline = self.loop.time() + self._header_timeout
        self._timer = self.loop.call_later(listener.tick_s, self._on_timer)
        if self.server_of.stopping:  # accepted while the server began to stop
            self.shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for cycle in (self.cycle, *self._pipeline):
            if cycle is not None and not cycle.complete:
                cycle.disconnected = True
                cycle.wake()
        running = self._running
        if running is not None:
            cycle, task = running
            if not cycle.complete:
                cycle.disconnected = True
                cycle.wake()
                if not task.done() and cycle.scope.get(CANCEL_ON_DISCONNECT):
                    # nobody will read the answer: a route that asked for it stops computing it
                    task.cancel(CLIENT_GONE)
        self.resume_writing()
        if exc is None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a request in flight sees the disconnect

    def data_received(self, data: bytes) -> None:
        if self._phase != _BODY:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no upgrades here (WebSocket, h2c): the request was answered as a plain one
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._refuse(self.listener.too_large)
                return
            log.debug("invalid HTTP request from %s: %s", self.client, exc)
            self._refuse(self.listener.invalid)
            return
        if self._phase != _BODY and self._head_bytes > self._max_head:
            self._refuse(self.listener.too_large)

    # ---- flow control ----
    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)
        self._writable = None

    async def drain(self) -> None:
        """Until the transport's write buffer is under its low mark again (or the client left)."""
        if self._writable is None:
            self._writable = self.loop.create_future()
        await self._writable

    # ---- parser callbacks ----
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect_continue = False
        self._body_size = -1
        self._phase = _HEAD
        self._deadline = self.loop.time() + self._header_timeout
        if self._timer is None:
            self._timer = self.loop.call_later(self.listener.tick_s, self._on_timer)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self._body_size = int(value) if value.isdigit() else -2
        elif name == b"transfer-encoding":
            self._body_size = -2
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        # the bytes counted include what followed the head in the same chunk: measure
        # the head itself only when the count says it might be over
        if self._head_bytes > self._max_head and self._head_size() > self._max_head:
            raise _HeadTooLarge
        parser = self.parser
        version = parser.get_http_version()
        raw_url = self._url
        query = b""
        if raw_url[:1] == b"/" and b"?" not in raw_url and b"#" not in raw_url:
            raw_path = raw_url  # a plain path, the common case: nothing to split
        else:
            url = httptools.parse_url(raw_url)
            raw_path, query = url.path, url.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": _METHODS.get(method := parser.get_method()) or method.decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self._headers,
        }
        keep_alive = version != "1.0" and parser.should_keep_alive() and not self._closing
        cycle = Cycle(self, scope, keep_alive, self._expect_continue)
        self._phase = _BODY
        self._deadline = self.loop.time() + self._body_timeout
        previous = self.cycle
        self.cycle = cycle
        if previous is None or previous.complete:
            if self._defer():
                self._deferred = cycle
            else:
                self._start(cycle)
        else:  # pipelined: answered in order, after the one before it
            self.pause_reading()
            self._pipeline.appendleft(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle is None or cycle.complete:
            return  # answered already (a 413 before the body): dropped
        cycle.add_body(body)
        if cycle.size > _HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        self._head_bytes = 0
        cycle = self.cycle
        if cycle is None:
            return
        cycle.more_body = False
        if self._deferred is cycle:
            self._deferred = None
            self._phase = _BUSY  # the answer may come at once, inside _start
            express = self.express
            if express is None or not cycle.answer_now(express):
                self._start(cycle)
        else:
            cycle.wake()
        if cycle.complete:
            # answered already (at once, or a 413 before the body was read): the connection is
            # idle now, unless its answer made it so (on_response_complete)
            if self._phase != _IDLE:
                self._set_idle()
        else:
            self._phase = _BUSY
            self._deadline = math.inf

    # ---- requests ----
    def _defer(self) -> bool:
        """Whether the request just parsed starts once its body is in rather than now: a
        small body of known length, which mostly came with the head. Its application then
        reads the body at once instead of waiting for it, and can answer inside this
        callback (``_start``). A large, chunked or 100-continue body starts now, and its
        application reads it as it comes."""
        return 0 <= self._body_size <= _HIGH_WATER and not self._expect_continue

    def _start(self, cycle: Cycle, eager: bool = True) -> None:
        """Run ``cycle``'s application: at once where it may (``eager``), else as a task. A
        pipelined request starts as a task: started at once from the end of the one before
        it, a chain of them answered without waiting would recurse once per request."""
        coro = cycle.run(self.app)
        if eager and eager_route(cycle.scope):
            task = start_eager(self.loop, coro)
            if task is None:  # answered already: on_response_complete has run
                return
        else:
            task = self.loop.create_task(coro)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        if not cycle.complete:
            self._running = (cycle, task)

    def on_response_complete(self, cycle: Cycle) -> None:
        """Called by ``cycle`` when its response is out."""
        self.server_of.total_requests += 1
        running = self._running
        if running is not None and running[0] is cycle:
            self._running = None
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self._pipeline:
            self._start(self._pipeline.pop(), eager=False)
        elif self._phase == _BUSY:
            self._set_idle()

    def shutdown(self) -> None:
        """Called by the server when it stops. Every request on this connection from now
        on is answered with ``Connection: close``; an idle connection is closed only after
        ``DRAIN_IDLE_S`` of silence. Closing it at once loses the request a client sends on
        it at that moment (a reset: the client cannot tell whether it ran); a client in a
        loop sends its next one within the second, gets its answer and the close, and then
        finds the port closed, which it knows was refused."""
        self._closing = True
        for cycle in (self.cycle, *self._pipeline):
            if cycle is not None:
                cycle.keep_alive = False
        running = self._running
        if running is not None:
            running[0].keep_alive = False
        elif self._phase == _IDLE:
            self._deadline = min(self._deadline, self.loop.time() + DRAIN_IDLE_S)
            if self._timer is None:
                self._timer = self.loop.call_later(DRAIN_IDLE_S, self._on_timer)

    # ---- limits ----
    def _set_idle(self) -> None:
        self._phase = _IDLE
        self._deadline = self.loop.time() + self._keep_alive
        if self._timer is None:
            self._timer = self.loop.call_later(self.listener.tick_s, self._on_timer)

    def _head_size(self) -> int:
        # the request line and header lines as sent, give or take optional whitespace
        return len(self._url) + 16 + sum(len(name) + len(value) + 4 for name, value in self._headers)

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
        elif self.read_paused:
            # reading stopped on our side (the application has not taken the body yet, or
            # a pipelined request waits): not the client's delay
            self._deadline = now + self._body_timeout
            self._timer = self.loop.call_later(self.listener.tick_s, self._on_timer)
        else:
            self._refuse(self.listener.body_timeout)

    def close_after(self, cycle: Cycle) -> None:
        """Close the connection once ``cycle``'s response is written (``Connection: close``).
        When its request body has not all arrived (answered early: a 413 on its
        Content-Length, say), half-close and linger as ``_refuse`` does: closing with body
        bytes unread resets the connection, and the client never reads its answer."""
        transport = self.transport
        if not cycle.more_body or transport.is_closing():
            transport.close()
            return
        if transport.can_write_eof():
            transport.write_eof()
        self._linger()

    def _linger(self) -> None:
        self.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.connections.discard(self)
        self.transport.set_protocol(Lingering(self.transport, self.connections, self.loop))

    def _refuse(self, answer: bytes) -> None:
        """Answer ``answer`` and close, unless a response is already under way (then just close)."""
        cycle = self.cycle
        if self._phase == _BODY and cycle is not None:
            # the request being read is ``cycle``'s, and its application waits for the body
            if cycle.started:
                self.transport.close()
                return
            cycle.disconnected = True
            cycle.wake()
        elif cycle is not None and not cycle.complete:
            self.transport.close()  # the previous request is still being answered
            return
        transport = self.transport
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self._linger()

    def _log_refused(self, listener: Listener) -> None:
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
