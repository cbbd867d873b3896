"""gRPC calls over the HTTP/2 connection (server/h2/h2_connection.py): message framing, compression,
deadlines, status trailers, and the dispatch of each call to the servicer.

Wire format (gRPC's PROTOCOL-HTTP2.md): a request is HEADERS (``:path`` names the method,
``grpc-timeout``, ``grpc-encoding``, metadata) and length-prefixed messages in DATA; an
answer is HEADERS, messages, and trailers with ``grpc-status`` and ``grpc-message``, or
the trailers alone ("Trailers-Only") when it fails before any message.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from milliserve.errors import MilliserveError, RequestTooLargeError
from milliserve.protocol.compression import ENCODINGS, decompress
from milliserve.server.eager import start_eager
from milliserve.server.h2.h2_connection import Http2Protocol
from milliserve.server.h2.hpack_codec import literal
from milliserve.server.h2.stream import Stream

__all__ = ["CallContext", "Dispatcher", "Method", "StatusError", "status_block"]

log = logging.getLogger(__name__)

OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14
ACCEPT_ENCODING = b"identity,deflate,gzip"
_HEAD = (
    b"\x88"
    + literal(b"content-type", b"application/grpc")
    + literal(b"grpc-accept-encoding", ACCEPT_ENCODING)
)
_OK_TRAILERS = literal(b"grpc-status", b"0")
_PREFIX = struct.Struct(">BL")
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# headers that are the transport's, not the call's metadata (grpc.aio leaves them out too)
_TRANSPORT = frozenset(
    {b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"user-agent"}
)
# a grpc-message is cut to this many characters: an error that echoes a 100 KB name must
# still fit the client's header limit and arrive as what it is
MAX_STATUS_MESSAGE = 1024
# compressed messages larger than this are decompressed off the event loop
_OFFLOAD_BYTES = 256 * 1024
# a message larger than this, alone in its stream's buffer, is handed over without a copy
_HANDOVER_BYTES = 64 * 1024


class StatusError(Exception):
    """End the call with this status (the servicer's errors become these)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status_block(code: int, message: str, http_head: bool = False, extra: bytes = b"") -> bytes:
    """Trailers (or, with ``http_head``, a Trailers-Only answer) for a status."""
    out = _HEAD if http_head else b""
    out += _OK_TRAILERS if code == OK else literal(b"grpc-status", str(code).encode())
    if message:
        if len(message) > MAX_STATUS_MESSAGE:
            message = message[: MAX_STATUS_MESSAGE - 1] + "…"
        # percent-encoded as gRPC says: printable ASCII except '%' stays as it is
        out += literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    return out + extra


@dataclass(frozen=True, slots=True)
class Method:
    """One method of the service: its handler, and whether requests/answers stream."""

    handler: Callable[..., Any]
    streaming: bool


class CallContext:
    """What a servicer method sees of its call (the subset of ``grpc.aio.ServicerContext``
    the servicer uses, so one servicer serves both stacks)."""

    __slots__ = ("_headers", "connection", "deadline", "peer_host", "trailing", "unary")

    def __init__(
        self,
        headers: list[tuple[bytes, bytes]],
        deadline: float | None,
        unary: bool,
        peer_host: str = "",
        connection: object = None,
    ) -> None:
        self._headers = headers
        self.deadline = deadline
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.unary = unary
        self.peer_host = peer_host  # the client's address (shared memory is for loopback only)
        self.connection = connection  # the HTTP/2 connection: the client, for queue fairness

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in self._headers
            if not k.startswith(b":") and k not in _TRANSPORT
        )

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: Any, message: str) -> None:
        raise StatusError(code.value[0] if hasattr(code, "value") else int(code), message)


class Call:
    """One call on one stream."""

    __slots__ = ("conn", "ctx", "encoding", "method", "queue", "stream", "task", "timer", "unary")

    def __init__(
        self, conn: Http2Protocol, stream: Stream, method: Method, ctx: CallContext, encoding: str
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.method = method
        self.ctx = ctx
        self.encoding = encoding
        self.unary = not method.streaming
        # the unary call's work (a done future when it finished inside the callback that
        # received its message: server/eager.py), or the stream's
        self.task: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.queue: asyncio.Queue[tuple[bytes, int] | None] | None = None

    def expire(self) -> None:
        """The client's deadline passed: answer DEADLINE_EXCEEDED, stop the work."""
        if self.stream.local_closed:
            return
        if self.task is not None:
            self.task.cancel()
        self.conn.trailers_only(
            self.stream, status_block(DEADLINE_EXCEEDED, "deadline exceeded", not self.stream.started)
        )


class Dispatcher:
    """The connection's StreamHandler: opens calls, cuts messages, runs handlers."""

    def __init__(
        self,
        methods: dict[bytes, Method],
        offload: Callable[..., Awaitable[Any]],
        max_message_bytes: int,
        on_call: Callable[[], None],
    ) -> None:
        self.methods = methods
        self.offload = offload
        self.max_message = max_message_bytes
        self.on_call = on_call
        self.running: set[asyncio.Task[None]] = set()

    # -- StreamHandler ---------------------------------------------------------------------
    def refuse_headers(self, conn: Http2Protocol, stream: Stream, limit: int) -> None:
        conn.trailers_only(
            stream,
            status_block(RESOURCE_EXHAUSTED, f"the call's metadata is over the limit of {limit} bytes", True),
        )

    def open(self, conn: Http2Protocol, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        path = b""
        timeout = encoding = b""
        content_type = b""
        method = b""
        for k, v in headers:
            if k == b":path":
                path = v
            elif k == b":method":
                method = v
            elif k == b"grpc-timeout":
                timeout = v
            elif k == b"grpc-encoding":
                encoding = v
            elif k == b"content-type":
                content_type = v
        if method != b"POST":
            conn.trailers_only(stream, _http_status(405))
            return
        if not content_type.startswith(b"application/grpc"):
            conn.trailers_only(stream, _http_status(415))
            return
        entry = self.methods.get(path)
        if entry is None:
            shown = path.decode("latin-1")[:200]
            conn.trailers_only(stream, status_block(UNIMPLEMENTED, f"unknown method {shown}", True))
            return
        enc = encoding.decode("latin-1") or "identity"
        if enc not in ENCODINGS:
            conn.trailers_only(
                stream,
                status_block(
                    UNIMPLEMENTED,
                    f"message encoding '{enc[:40]}' is not supported (identity, deflate, gzip are)",
                    True,
                ),
            )
            return
        deadline = None
        if timeout:
            seconds = _timeout(timeout)
            if seconds is None:
                conn.trailers_only(stream, status_block(INVALID_ARGUMENT, "malformed grpc-timeout", True))
                return
            deadline = asyncio.get_running_loop().time() + seconds
        self.on_call()
        ctx = CallContext(headers, deadline, not entry.streaming, conn.peer, conn)
        call = Call(conn, stream, entry, ctx, enc)
        stream.call = call
        if deadline is not None:
            call.timer = asyncio.get_running_loop().call_at(deadline, call.expire)
        if entry.streaming:
            call.queue = asyncio.Queue()
            self._start(call, self._run_stream(call))
        if stream.remote_closed:
            self.data(conn, stream)

    def data(self, conn: Http2Protocol, stream: Stream) -> None:
        call: Call | None = stream.call
        if call is None:
            return
        buf = stream.data
        while len(buf) >= 5:
            flag, length = _PREFIX.unpack_from(buf, 0)
            if length > self.max_message:
                self._fail_early(
                    call,
                    RESOURCE_EXHAUSTED,
                    f"the message is {length} bytes, over the limit of {self.max_message}",
                )
                return
            if len(buf) < 5 + length:
                conn.want(stream, 5 + length - len(buf))  # a large message: grant its window
                break
            message: bytes | memoryview
            if call.unary and not flag and len(buf) == 5 + length and length > _HANDOVER_BYTES:
                # a large message alone in the buffer: handed over, not copied (a copy of 16 MB
                # held the event loop for 10 to 30 ms here, page faults included)
                message = memoryview(buf)[5:]
                stream.data = buf = bytearray()
            else:
                message = bytes(buf[5 : 5 + length])
                del buf[: 5 + length]
            if flag and call.encoding == "identity":
                self._fail_early(call, INTERNAL, "a compressed message without grpc-encoding")
                return
            self._message(call, message, bool(flag), 5 + length)
            if stream.local_closed:
                return
        if stream.remote_closed and call.unary and call.task is None and not stream.local_closed:
            if buf:
                self._fail_early(call, INTERNAL, "the request ends inside a message")
            else:
                self._fail_early(call, UNIMPLEMENTED, "a unary call without a request message")
        elif stream.remote_closed and call.queue is not None:
            if buf:
                call.queue.put_nowait((b"", -1))
            call.queue.put_nowait(None)

    def reset(self, stream: Stream) -> None:
        call: Call | None = stream.call
        if call is None:
            return
        if call.timer is not None:
            call.timer.cancel()
        if call.task is not None:
            call.task.cancel()

    # -- calls -----------------------------------------------------------------------------
    def _message(self, call: Call, message: bytes | memoryview, compressed: bool, wire_bytes: int) -> None:
        if call.unary:
            if call.task is not None:
                self._fail_early(call, UNIMPLEMENTED, "a unary call with more than one request message")
                return
            call.conn.consumed(call.stream, wire_bytes)
            self._start(call, self._run_unary(call, message, compressed), eager=True)
        else:
            assert call.queue is not None and isinstance(message, bytes)  # only unary ones are handed over
            call.queue.put_nowait((message, wire_bytes if not compressed else -wire_bytes - 1))

    def _start(self, call: Call, coro: Any, eager: bool = False) -> None:
        """Run a call's coroutine as a task; ``eager``: step it now, and make the task only
        if it has to wait (``server/eager.py``: a ModelInfer on a microsecond model answers
        before the frames that brought it are all parsed)."""
        loop = asyncio.get_running_loop()
        if eager:
            task = start_eager(loop, coro)
            if task is None:
                done = call.task = loop.create_future()
                done.set_result(None)
                return
        else:
            task = loop.create_task(coro)
        call.task = task
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    def _fail_early(self, call: Call, code: int, message: str) -> None:
        if call.task is not None:
            call.task.cancel()
        if call.timer is not None:
            call.timer.cancel()
        call.conn.trailers_only(call.stream, status_block(code, message, not call.stream.started))

    async def _decompress(self, call: Call, message: bytes) -> bytes:
        try:
            if len(message) > _OFFLOAD_BYTES:
                out: bytes = await self.offload(decompress, message, call.encoding, self.max_message)
                return out
            return decompress(message, call.encoding, self.max_message)
        except RequestTooLargeError as exc:
            raise StatusError(RESOURCE_EXHAUSTED, exc.message) from None
        except MilliserveError as exc:
            raise StatusError(INTERNAL, exc.message) from None

    async def _run_unary(self, call: Call, message: bytes | memoryview, compressed: bool) -> None:
        stream, conn = call.stream, call.conn
        try:
            if compressed:
                assert isinstance(message, bytes)  # only uncompressed messages are handed over
                message = await self._decompress(call, message)
            reply = await call.method.handler(message, call.ctx)
            body = reply.SerializeToString()
        except Exception as exc:  # a cancelled call (BaseException) just ends
            self._failed(call, exc)
            return
        if call.timer is not None:
            call.timer.cancel()
        trailers = _OK_TRAILERS + _metadata(call.ctx.trailing)
        if len(body) > self.max_message:
            self._finish(call, status_block(RESOURCE_EXHAUSTED, "the answer is over the message limit", True))
            return
        conn.respond(stream, _HEAD, _PREFIX.pack(0, len(body)) + body, trailers)

    def _failed(self, call: Call, exc: Exception) -> None:
        """End a call with its StatusError's status, or INTERNAL (logged) for anything else."""
        if isinstance(exc, StatusError):
            code, message = exc.code, exc.message
        else:
            log.error("unhandled error in gRPC call on stream %d", call.stream.id, exc_info=exc)
            code, message = INTERNAL, "internal server error (logged)"
        self._finish(call, status_block(code, message, not call.stream.started))

    def _finish(self, call: Call, block: bytes) -> None:
        if call.timer is not None:
            call.timer.cancel()
        if call.stream.started:
            call.conn.finish(call.stream, block)
        else:
            call.conn.trailers_only(call.stream, block)

    async def _requests(self, call: Call) -> AsyncIterator[bytes | None]:
        """The stream's request messages, each credited back to the client's window as the
        servicer takes it (so a servicer that reads no further stops the client). An
        undecodable message is ``None``."""
        assert call.queue is not None
        while (item := await call.queue.get()) is not None:
            message, wire = item
            if wire == -1:
                yield None  # the stream ended inside a message
                continue
            compressed = wire < 0
            call.conn.consumed(call.stream, -wire - 1 if compressed else wire)
            if compressed:
                try:
                    message = await self._decompress(call, message)
                except StatusError:
                    yield None
                    continue
            yield message

    async def _run_stream(self, call: Call) -> None:
        stream, conn = call.stream, call.conn
        head: bytes | None = _HEAD
        try:
            async for reply in call.method.handler(self._requests(call), call.ctx):
                body = reply.SerializeToString()
                conn.send(stream, head, _PREFIX.pack(0, len(body)) + body)
                head = None
                await conn.writable(stream)
                if stream.local_closed:
                    return
        except Exception as exc:  # a cancelled call (BaseException) just ends
            self._failed(call, exc)
            return
        self._finish(call, status_block(OK, "", not stream.started, _metadata(call.ctx.trailing)))


def _http_status(code: int) -> bytes:
    return literal(b":status", str(code).encode())


def _metadata(pairs: tuple[tuple[str, str], ...]) -> bytes:
    return b"".join(literal(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs)


def _timeout(value: bytes) -> float | None:
    text = value.decode("latin-1")
    unit = _TIMEOUT_UNITS.get(text[-1:])
    digits = text[:-1]
    if unit is None or not digits.isascii() or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit
