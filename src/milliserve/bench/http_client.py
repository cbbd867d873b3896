"""The load generator's HTTP/1.1 client for request/response modes (tensors over HTTP,
embeddings): keep-alive connections on plain sockets, answers read on the event loop.

A request goes out in one of two ways. In a closed loop a coroutine sends it and awaits the
answer. In an open loop the clock thread sends it itself, the moment its schedule says,
straight into the socket: handing the send to the event loop first cost a thread wake-up
(20-80 µs on 2 vCPUs) that the latency, measured from the schedule, then charged to the
server (docs/bench.md, "Which clock is right"). Either way the event loop reads the answers
(``add_reader``), and every instant comes from ``time.monotonic()``, which is the system's
CLOCK_MONOTONIC: the same clock as the server's own timestamps on this machine.

Answers are framed by Content-Length (every OIP and OpenAI server sends one for these
routes); a connection the server closes is dropped, and one it announced a keep-alive
timeout for is not reused within a second of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from milliserve.bench.records import CONNECT_ERROR, Recorder

__all__ = ["HttpClient", "HttpRequests"]

Finished = Callable[[int], None]  # told each request's phase as it ends


@dataclass(frozen=True)
class HttpRequests:
    """Where to send, and the requests ready to write (each a tuple of writes: one, or the
    head and the body apart to reproduce libcurl's two writes)."""

    host: str
    port: int
    requests: list[tuple[bytes, ...]]


class _Conn:
    __slots__ = ("buf", "busy", "closed", "expires", "intended", "n", "phase", "sent", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.expires = math.inf
        self.n = 0
        self.intended = self.sent = 0.0
        self.phase = 0


def _answer(buf: bytearray) -> tuple[int, int, bytes, bytes] | None:
    """(status, bytes it took, lower-cased head, body) once ``buf`` holds a whole answer."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).lower()
    length = 0
    i = head.find(b"\r\ncontent-length:")  # not Inference-Header-Content-Length
    if i >= 0:
        j = head.find(b"\r\n", i + 2)
        length = int(head[i + 17 : j if j >= 0 else len(head)])
    total = end + 4 + length
    if len(buf) < total:
        return None
    return int(head[9:12]), total, head, bytes(buf[end + 4 : total])


class HttpClient:
    """Sends ``requests`` round-robin and records each one into ``rec``."""

    def __init__(self, target: HttpRequests, rec: Recorder, finished: Finished) -> None:
        self.t = target
        self.rec = rec
        self.finished = finished
        self.idle: deque[_Conn] = deque()
        self.waiters: dict[_Conn, asyncio.Future[int]] = {}
        # started by one thread at a time (the loop, or the open loop's clock), ended on the loop
        self.started = self.ended = 0
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.progress = asyncio.Event()

    def _on_loop(self, fn: Callable[..., None], *args: object) -> None:
        if threading.get_ident() == self.loop_thread:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    # ---- connections ----
    def _take(self) -> _Conn | None:
        while self.idle:
            c = self.idle.pop()
            if not c.closed and time.monotonic() < c.expires:
                return c
            self._on_loop(self._drop, c)
        return None

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self.t.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _drop(self, c: _Conn) -> None:
        c.closed = True
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(c.sock.fileno())
        c.sock.close()

    # ---- sending ----
    def _begin(self, c: _Conn, n: int, intended: float, phase: int) -> list[bytes]:
        c.n, c.intended, c.phase, c.busy, c.buf = n, intended, phase, True, bytearray()
        self.started += 1
        c.sent = time.monotonic()
        return list(self.t.requests[n % len(self.t.requests)])

    async def request(self, n: int, intended: float, phase: int) -> int:
        """Send request ``n`` from the event loop and wait for its answer (closed loop); its
        status."""
        c = self._take()
        try:
            if c is None:
                sock = self._socket()
                sock.setblocking(False)
                c = _Conn(sock)
                await self.loop.sock_connect(sock, (self.t.host, self.t.port))
                self.loop.add_reader(sock.fileno(), self._readable, c)
        except OSError as exc:
            self.started += 1
            self._failed(c, intended, phase, time.monotonic(), exc)
            return CONNECT_ERROR
        future = self.waiters[c] = self.loop.create_future()
        try:
            for part in self._begin(c, n, intended, phase):
                await self.loop.sock_sendall(c.sock, part)
        except OSError as exc:
            self._failed(c, intended, phase, time.monotonic(), exc)
            return CONNECT_ERROR
        status: int = await future
        return status

    def send_now(self, n: int, intended: float, phase: int) -> None:
        """Send request ``n`` from the calling (clock) thread at once; its answer is read on
        the event loop (open loop). A new connection is opened here, blocking: on loopback
        it takes tens of microseconds, which the next sends' lateness shows."""
        c = self._take()
        try:
            if c is None:
                sock = self._socket()
                sock.settimeout(10)
                c = _Conn(sock)
                sock.connect((self.t.host, self.t.port))
                sock.setblocking(False)
                self.loop.call_soon_threadsafe(self.loop.add_reader, sock.fileno(), self._readable, c)
            for part in self._begin(c, n, intended, phase):
                view = memoryview(part)
                while view:  # a large body waits here for the socket to drain
                    try:
                        view = view[c.sock.send(view) :]
                    except BlockingIOError:
                        select.select([], [c.sock], [], 10)
        except OSError as exc:
            if c is None or not c.busy:
                self.started += 1
            self.loop.call_soon_threadsafe(self._failed, c, intended, phase, time.monotonic(), exc)

    # ---- answers (event loop) ----
    def _readable(self, c: _Conn) -> None:
        now = time.monotonic()
        try:
            data = c.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(c, now, f"{type(exc).__name__}: {exc}")
            return
        if not data:
            self._lost(c, now, "the server closed the connection")
            return
        c.buf += data
        if not c.busy:
            return
        try:
            answer = _answer(c.buf)
        except ValueError:
            self._lost(c, now, "not an HTTP answer")
            return
        if answer is None:
            return
        status, _, head, body = answer
        c.busy = False
        if b"connection: close" in head:
            self._drop(c)
        else:
            if (k := head.find(b"\r\nkeep-alive: timeout=")) >= 0:
                end = head.find(b"\r\n", k + 2)
                with contextlib.suppress(ValueError):
                    timeout = float(head[k + 22 : end if end >= 0 else len(head)].split(b",")[0])
                    c.expires = now + timeout - 1.0
            self.idle.append(c)
        message = "" if status == 200 else body.decode(errors="replace")
        self.rec.add(c.intended, c.phase, c.sent, now, status, message)
        self._end(c, c.phase, status)

    def _lost(self, c: _Conn, now: float, why: str) -> None:
        busy = c.busy
        c.busy = False
        self._drop(c)
        with contextlib.suppress(ValueError):
            self.idle.remove(c)
        if busy:
            self.rec.add(c.intended, c.phase, c.sent, now, CONNECT_ERROR, why)
            self._end(c, c.phase, CONNECT_ERROR)

    def _failed(self, c: _Conn | None, intended: float, phase: int, now: float, exc: OSError) -> None:
        if c is not None:
            c.busy = False
            self._drop(c)
        self.rec.add(intended, phase, now, now, CONNECT_ERROR, f"{type(exc).__name__}: {exc}")
        self._end(c, phase, CONNECT_ERROR)

    def _end(self, c: _Conn | None, phase: int, status: int) -> None:
        self.ended += 1
        self.progress.set()
        waiter = self.waiters.pop(c, None) if c is not None else None
        if waiter is not None and not waiter.done():
            waiter.set_result(status)
        self.finished(phase)

    async def close(self) -> None:
        """Wait for what is in flight (every request started has ended), then close every
        connection."""
        while self.ended < self.started:
            self.progress.clear()
            await self.progress.wait()
        while self.idle:
            self._drop(self.idle.pop())
