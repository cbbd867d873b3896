"""One request and its response on an HTTP/1.1 connection, as an ASGI ``receive`` and
``send`` (``server/http/connection.py`` parses and owns the connection).

What it does differently from uvicorn's cycle, for the tensor road's microseconds:

- **One write per response.** ``http.response.start`` is held until the first body
  message, and a response whose body comes in one message goes out in one
  ``transport.write``: head and body in one segment, one wake-up of the client. uvicorn
  writes the head and the body apart (two syscalls, two wake-ups: ~15 µs each here).
- **A known length.** A one-message body without ``content-length`` gets one; chunked
  transfer encoding only for a streamed response (``more_body``) without a length.
- **No per-request objects beyond this one:** no ``asyncio.Event``; ``receive`` waits on a
  future only when the body has not arrived yet.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Callable
from typing import Any, Protocol

from milliserve.runtime.soon import Soon
from milliserve.server.http.asgi import CLIENT_GONE, Message

__all__ = ["STATUS_LINE", "Answer", "Connection", "Cycle", "Express"]

log = logging.getLogger("milliserve.server.http")


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("latin-1")


STATUS_LINE = {code: _status_line(code) for code in range(100, 600)}
_DISCONNECT: Message = {"type": "http.disconnect"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)
_NO_BODY_STATUS = frozenset((204, 304))


# a response as (status, body, headers)
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
# an application's express lane (``HttpApp.express``): the answer to a request whose body is
# in, computed at once or later in the loop's turn (a ``Soon``: ``ModelRuntime.infer_soon``),
# or None for the application to run as always
Express = Callable[[dict[str, Any], bytes], "Answer | Soon[Answer] | None"]


class Connection(Protocol):
    """What a cycle needs of its connection (``connection.HttpProtocol``), declared here so
    that this module does not import that one."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    write_paused: bool
    default_head: bytes
    close_head: bytes

    def resume_reading(self) -> None: ...

    async def drain(self) -> None: ...

    def close_after(self, cycle: Cycle) -> None: ...

    def on_response_complete(self, cycle: Cycle) -> None: ...


class Cycle:
    """The request's body as it arrives, and its response as the application sends it."""

    __slots__ = (
        "_chunks",
        "_delivered_last",
        "_waiter",
        "chunked",
        "complete",
        "conn",
        "disconnected",
        "expect_continue",
        "head",
        "keep_alive",
        "more_body",
        "scope",
        "size",
        "started",
        "transport",
    )

    def __init__(
        self, conn: Connection, scope: dict[str, Any], keep_alive: bool, expect_continue: bool
    ) -> None:
        self.conn = conn
        self.transport = conn.transport  # generate.py bounds a stream's send buffer through it
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self._chunks: list[bytes] = []
        self.size = 0  # body bytes received and not yet handed to the application
        self.more_body = True
        self._delivered_last = False
        self._waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False  # http.response.start seen
        self.head: Message | None = None  # ... and not written yet
        self.chunked = False  # a streamed response without a length
        self.complete = False

    # ---- fed by the connection ----
    def add_body(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self.size += len(chunk)

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- ASGI ----
    async def run(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError as exc:
            if exc.args[:1] != (CLIENT_GONE,):
                raise
        except BaseException as exc:
            log.error("exception in the HTTP application", exc_info=exc)
            if not self.started:
                self._fail()
            else:
                self.transport.close()
        else:
            # nothing to complete when the connection is gone or closing: its client left, or
            # the route closed it itself (a generation stream whose client stopped reading)
            if self.disconnected or self.complete or self.transport.is_closing():
                return
            log.error(
                "the HTTP application returned without %s a response",
                "completing" if self.started else "starting",
            )
            if not self.started:
                self._fail()
            else:
                self.transport.close()

    def _fail(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(_INTERNAL_ERROR)
            self.transport.close()
        self._done()

    async def receive(self) -> Message:
        if self.expect_continue:
            self.expect_continue = False
            if not self.transport.is_closing():
                self.transport.write(_CONTINUE)
        while True:
            if self.disconnected or self.complete or self._delivered_last:
                if not (self.disconnected or self.complete):
                    await self._wait()  # the whole body was read: what comes next is the end
                    continue
                return _DISCONNECT
            if self._chunks or not self.more_body:
                chunks = self._chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self.size = 0
                more = self.more_body
                self._delivered_last = not more
                self.conn.resume_reading()
                return {"type": "http.request", "body": body, "more_body": more}
            self.conn.resume_reading()
            await self._wait()

    async def _wait(self) -> None:
        waiter = self.conn.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self.started = True
            self.expect_continue = False
            self.head = message
            return
        if self.complete:
            raise RuntimeError(f"ASGI message {kind!r} after the response was complete")
        if kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        head = self.head
        if head is not None:
            self.head = None
            out = self._head_bytes(head, None if more else len(body))
        else:
            out = b""
        if self.scope["method"] == "HEAD":
            body = b""
        elif self.chunked:
            body = (b"%x\r\n%b\r\n" % (len(body), body) if body else b"") + (b"" if more else b"0\r\n\r\n")
        if out or body:
            self.transport.write(out + body if out else body)
        if not more:
            self._done()
            if not self.keep_alive:
                self.conn.close_after(self)

    def answer_now(self, express: Express) -> bool:
        """Answer with ``express``'s response when it gives one for this request (whose
        whole body is in and unread), in one write: computed in this call, or later in the
        loop's turn (a ``Soon``; the cycle is then complete only once it came); False: it
        gave none, and the application is to run as always."""
        chunks = self._chunks
        try:
            answer = express(self.scope, chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except Exception:  # a bug: logged, and the application answers the request
            log.exception("exception in the HTTP application's express lane")
            return False
        if answer is None:
            return False
        if isinstance(answer, Soon):
            answer.then(self._answer_soon)
            return True
        self._write_answer(answer)
        return True

    def _answer_soon(self, answer: Answer | BaseException) -> None:
        if isinstance(answer, BaseException):  # a bug: logged, and answered as the road's are
            log.error("exception in the HTTP application's express lane", exc_info=answer)
            self._fail()
            return
        try:
            self._write_answer(answer)
        except Exception:  # e.g. an invalid header: the other requests of the turn go on
            log.exception("exception in the HTTP application's express lane")
            if not self.complete:
                self._fail()

    def _write_answer(self, answer: Answer) -> None:
        status, body, headers = answer
        self.started = True
        head = self._head_bytes({"status": status, "headers": headers}, len(body))
        if not self.transport.is_closing():
            self.transport.write(head + body)
        self._done()
        if not self.keep_alive:
            self.conn.close_after(self)

    def _head_bytes(self, head: Message, length: int | None) -> bytes:
        status = head["status"]
        parts = [STATUS_LINE[status], self.conn.default_head if self.keep_alive else self.conn.close_head]
        has_length = False
        for name, value in head.get("headers", ()):
            # CR, LF (and ':' in a name) would let a value split the response; ints, not
            # b"\r": ``bytes in bytes`` first tries the operand as an int and formats a TypeError
            if 13 in value or 10 in value or 13 in name or 10 in name or 58 in name:
                raise RuntimeError(f"invalid HTTP header {name!r}: {value!r}")
            if name == b"content-length":
                has_length = True
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive = False  # said once, below
                continue
            parts += (name, b": ", value, b"\r\n")
        if not has_length and status not in _NO_BODY_STATUS and status >= 200:
            if length is not None:
                parts.append(b"content-length: %d\r\n" % length)
            else:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive and parts[1] is not self.conn.close_head:
            parts[1] = self.conn.close_head
        parts.append(b"\r\n")
        return b"".join(parts)

    def _done(self) -> None:
        self.complete = True
        self.wake()
        self.conn.on_response_complete(self)
