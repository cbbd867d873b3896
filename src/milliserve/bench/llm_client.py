"""A streaming HTTP/1.1 client for OpenAI-compatible completions, timed per event.

Each connection is an asyncio protocol: bytes are stamped with ``time.monotonic()``
in ``data_received``, as the event loop reads them, and go through httptools (the C
parser uvicorn uses, which undoes chunked transfer-encoding) into the SSE parser.
Keep-alive connections are reused until a second before the idle timeout the server
announces (``Keep-Alive: timeout=5``, uvicorn's default); a reused connection that the
server closed anyway (before any byte of the answer) is retried once on a new one.

Nothing raises out of ``LlmClient.request``: a refused connection, an HTTP error, a
stream cut before its end, an error sent inside the stream or a timeout each come
back as a status with the first line of what went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
import orjson

from milliserve.bench.llm_stream import StreamTally, parse_server_timing
from milliserve.bench.openai_target import ApiTarget
from milliserve.bench.records import CONNECT_ERROR, Recorder
from milliserve.bench.sse import SseParser

__all__ = [
    "BAD_RESPONSE",
    "CONNECT_ERROR",
    "STREAM_CUT",
    "STREAM_ERROR",
    "TIMEOUT",
    "LlmClient",
    "StreamResult",
    "StreamingClient",
    "error_message",
]

STREAM_CUT = -2  # the connection ended before the response did
TIMEOUT = -3
STREAM_ERROR = -4  # 200, then an error object inside the stream
BAD_RESPONSE = -5  # not HTTP


class _Failed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class StreamResult:
    status: int  # 200, the HTTP status, or one of the negative codes above
    sent: float
    done: float
    tally: StreamTally
    message: str = ""


def error_message(body: bytes) -> str:
    """The message of an OpenAI error body (``{"error": {"message": ...}}``), FastAPI's
    ``{"detail": ...}``, or the body's first 300 characters."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:300]
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("detail", doc.get("message")))
        if isinstance(err, dict) and "message" in err:
            err = err["message"]
        if err is not None:
            return str(err)[:300]
    return body.decode(errors="replace").strip()[:300]


class _Exchange:
    """One response, read through httptools' callbacks."""

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.parser = httptools.HttpResponseParser(self)
        self.sse = SseParser()
        self.tally = StreamTally()
        self.now = 0.0
        self.status = 0
        self.body = bytearray()  # the body of an error answer
        self.framed = False  # chunked or with a length; else the body ends at the close
        self.headers_done = False
        self.got_bytes = False
        self.keep_alive = True
        self.idle_timeout_s = math.inf

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key in (b"transfer-encoding", b"content-length"):
            self.framed = True
        elif key == b"keep-alive":  # timeout=5: the server closes the idle connection then
            for part in value.decode("latin-1").split(","):
                param, _, number = part.strip().partition("=")
                if param.lower() == "timeout":
                    with contextlib.suppress(ValueError):
                        self.idle_timeout_s = float(number)
        elif key == b"server-timing":
            for stage, ms in parse_server_timing(value.decode("latin-1")).items():
                self.tally.timings[f"server-timing.{stage}"] = ms

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.status == 200:
            for event in self.sse.feed(body, self.now):
                self.tally.add(event)
        elif len(self.body) < 4096:
            self.body += body

    def on_message_complete(self) -> None:
        if self.status == 200:
            for event in self.sse.close(self.now):
                self.tally.add(event)
        self.keep_alive = self.parser.should_keep_alive()
        if not self.future.done():
            self.future.set_result(None)

    def feed(self, data: bytes, now: float) -> None:
        self.now = now
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BAD_RESPONSE, f"not an HTTP response: {exc}")

    def eof(self, exc: Exception | None) -> None:
        if self.future.done():
            return
        if self.headers_done and not self.framed:  # a body delimited by the close: complete
            self.keep_alive = False
            self.on_message_complete()
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
        self._fail(STREAM_CUT, f"stream cut after {len(self.tally.chunk_times)} content chunks ({why})")

    def _fail(self, status: int, message: str) -> None:
        if not self.future.done():
            self.future.set_exception(_Failed(status, message))


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.exchange: _Exchange | None = None
        self.closed = False
        # a second before the server's idle timeout: reusing it later would race its close
        self.expires = math.inf

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.exchange is not None:
            self.exchange.feed(data, now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.eof(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class LlmClient:
    """Sends streaming requests to ``target`` over a pool of keep-alive connections; a request
    that has not ended after ``timeout_s`` counts as TIMEOUT."""

    def __init__(self, target: ApiTarget, timeout_s: float = 300.0) -> None:
        self.target, self.timeout_s = target, timeout_s
        self.idle: list[_Conn] = []
        self.ssl = ssl.create_default_context() if target.scheme == "https" else None

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        t = self.target
        _, conn = await loop.create_connection(_Conn, t.host, t.port, ssl=self.ssl)
        return conn

    async def request(self, raw: bytes) -> StreamResult:
        """Send one request and read its stream to the end (or the workload's timeout)."""
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        deadline = sent + self.timeout_s
        for attempt in range(2):
            conn = None
            while self.idle and conn is None:
                c = self.idle.pop()
                if c.closed or time.monotonic() >= c.expires:
                    c.close()
                else:
                    conn = c
            reused = conn is not None
            if conn is None:
                try:
                    conn = await asyncio.wait_for(self._connect(), max(0.0, deadline - time.monotonic()))
                except (OSError, TimeoutError) as exc:
                    return StreamResult(CONNECT_ERROR, sent, time.monotonic(), StreamTally(), _why(exc))
            future: asyncio.Future[None] = loop.create_future()
            ex = conn.exchange = _Exchange(future)
            conn.transport.write(raw)
            try:
                await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                conn.close()
                n = len(ex.tally.chunk_times)
                msg = f"no end of stream after {self.timeout_s:g} s ({n} content chunks)"
                return StreamResult(TIMEOUT, sent, time.monotonic(), ex.tally, msg)
            except _Failed as exc:
                conn.close()
                if reused and not ex.got_bytes and attempt == 0:
                    continue  # the server closed the idle connection as we reused it
                return StreamResult(exc.status, sent, time.monotonic(), ex.tally, str(exc))
            done = ex.now
            conn.exchange = None
            if ex.keep_alive and not conn.closed:
                conn.expires = done + ex.idle_timeout_s - 1.0
                self.idle.append(conn)
            else:
                conn.close()
            if ex.status != 200:
                return StreamResult(ex.status, sent, done, ex.tally, error_message(bytes(ex.body)))
            if ex.tally.error is not None:
                return StreamResult(STREAM_ERROR, sent, done, ex.tally, ex.tally.error)
            return StreamResult(200, sent, done, ex.tally)
        raise AssertionError("unreachable: the second attempt always returns")

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()


class StreamingClient:
    """The LLM mode's client for the load generator: ``LlmClient``'s streams, recorded with
    their chunks. Sends go out from the event loop (an open loop hands them over: the
    figures here are milliseconds)."""

    send_now = None

    def __init__(
        self,
        target: ApiTarget,
        timeout_s: float,
        requests: list[bytes],
        rec: Recorder,
        finished: Callable[[int], None],
    ) -> None:
        self.http = LlmClient(target, timeout_s)
        self.requests, self.rec, self.finished = requests, rec, finished

    async def request(self, n: int, intended: float, phase: int) -> int:
        try:
            r = await self.http.request(self.requests[n % len(self.requests)])
        finally:
            self.finished(phase)
        self.rec.add(intended, phase, r.sent, r.done, r.status, r.message, r.tally)
        return r.status

    async def close(self) -> None:
        self.http.close()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
