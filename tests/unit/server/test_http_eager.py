"""A request that need not wait is answered inside the callback that completed it
(server/eager.py, server/http/connection.py); one that waits is carried on by a task that relays
to its coroutine exactly what a task would: results, errors, cancellation."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from milliserve.server.eager import start_eager
from milliserve.server.http.connection import HttpProtocol
from milliserve.server.http.listener import ConnectionLimits
from milliserve.server.http.server import HttpServer
from tests.support.transport import Transport


def in_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The test, run to completion in a fresh event loop."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


LIMITS = ConnectionLimits(65536, 10.0, 10.0, 10.0, 100)
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="outside")


def post(path: bytes, body: bytes) -> bytes:
    return b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (path, len(body), body)


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers the body it got, uppercased; waits a turn of the loop first for /wait."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] == "/wait":
        await asyncio.sleep(0)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body.upper()})


def connect(app: Any) -> tuple[HttpServer, HttpProtocol, Transport]:
    server = HttpServer(app, LIMITS, HttpProtocol)
    conn = server.connection()
    assert isinstance(conn, HttpProtocol)
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return server, conn, transport


@in_loop
async def test_a_request_that_need_not_wait_is_answered_before_data_received_returns() -> None:
    server, conn, transport = connect(echo)
    conn.data_received(post(b"/now", b"abc"))
    assert len(transport.out) == 1 and transport.out[0].endswith(b"\r\n\r\nABC")
    assert not server.tasks  # no task was made for it
    conn.data_received(post(b"/now", b"def"))  # and the connection is ready for the next
    assert transport.out[1].endswith(b"DEF")
    assert server.total_requests == 2
    conn.connection_lost(None)


@in_loop
async def test_a_request_that_waits_is_carried_on_by_a_task() -> None:
    server, conn, transport = connect(echo)
    conn.data_received(post(b"/wait", b"abc"))
    assert not transport.out and len(server.tasks) == 1
    await asyncio.gather(*server.tasks)
    assert transport.out[0].endswith(b"ABC")
    conn.connection_lost(None)


@in_loop
async def test_pipelined_requests_in_one_read_are_answered_in_order() -> None:
    _, conn, transport = connect(echo)
    conn.data_received(post(b"/wait", b"one") + post(b"/now", b"two") + post(b"/now", b"three"))
    for _ in range(100):
        if len(transport.out) == 3:
            break
        await asyncio.sleep(0)
    assert [o.rsplit(b"\r\n\r\n", 1)[1] for o in transport.out] == [b"ONE", b"TWO", b"THREE"]
    conn.connection_lost(None)


@in_loop
async def test_a_long_pipeline_answered_without_waiting_does_not_recurse() -> None:
    # the first request waits; the 2,000 behind it each answer at once when started
    _, conn, transport = connect(echo)
    conn.data_received(post(b"/wait", b"first") + post(b"/now", b"x") * 2000)
    for _ in range(10000):
        if len(transport.out) == 2001:
            break
        await asyncio.sleep(0)
    assert len(transport.out) == 2001 and transport.out[-1].endswith(b"X")
    conn.connection_lost(None)


@in_loop
async def test_a_chunked_body_is_read_as_it_comes() -> None:
    _, conn, transport = connect(echo)
    head = b"POST /now HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    conn.data_received(head + b"3\r\nabc\r\n")
    assert not transport.out  # started at the head, waiting for the rest of the body
    conn.data_received(b"2\r\nde\r\n0\r\n\r\n")
    for _ in range(100):
        if transport.out:
            break
        await asyncio.sleep(0)
    assert transport.out[0].endswith(b"ABCDE")
    conn.connection_lost(None)


@in_loop
async def test_the_rest_of_an_eager_coroutine_gets_results_errors_and_cancellation() -> None:
    loop = asyncio.get_running_loop()
    seen: list[Any] = []

    async def waits(future: asyncio.Future[int]) -> None:
        VAR.set("inside")
        try:
            seen.append(await future)
            seen.append(VAR.get())
            await asyncio.sleep(0)  # a bare yield is relayed too
            seen.append("after a bare yield")
        except ValueError as exc:
            seen.append(f"error {exc}")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    future: asyncio.Future[int] = loop.create_future()
    task = start_eager(loop, waits(future))
    assert task is not None and VAR.get() == "outside"  # its context is its own
    future.set_result(7)
    await task
    assert seen == [7, "inside", "after a bare yield"]

    seen.clear()
    future = loop.create_future()
    task = start_eager(loop, waits(future))
    assert task is not None
    future.set_exception(ValueError("bad"))
    await task
    assert seen == ["error bad"]

    seen.clear()
    future = loop.create_future()
    task = start_eager(loop, waits(future))
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"] and future.cancelled()


@in_loop
async def test_a_task_cancelled_before_its_first_step_still_unwinds_the_coroutine() -> None:
    # a client gone at once: its request's task is cancelled before it ever ran; the
    # coroutine must still see the cancellation (a batcher gives back the instance it holds)
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def holds(future: asyncio.Future[int]) -> None:
        try:
            await future
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("released")

    future: asyncio.Future[int] = loop.create_future()
    task = start_eager(loop, holds(future))
    assert task is not None
    task.cancel()  # before the loop gave it its first step
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled", "released"] and future.cancelled()


@in_loop
async def test_a_coroutine_that_never_waits_makes_no_task() -> None:
    done: list[int] = []

    async def at_once() -> None:
        done.append(1)

    assert start_eager(asyncio.get_running_loop(), at_once()) is None
    assert done == [1]


@in_loop
async def test_the_stop_waits_for_requests_in_flight_then_cancels_at_the_grace() -> None:
    release = asyncio.Event()

    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    server, conn, transport = connect(slow)
    await server.start(listening())
    conn.data_received(post(b"/now", b"x"))
    stopping = asyncio.ensure_future(server.stop(30.0))
    await asyncio.sleep(0.05)
    assert not stopping.done()  # the request in flight holds the stop
    release.set()
    await asyncio.sleep(0.05)
    assert b"connection: close" in transport.out[0]  # answered, and told the connection closes
    conn.connection_lost(None)
    await stopping

    release.clear()
    server, conn, transport = connect(slow)
    await server.start(listening())
    conn.data_received(post(b"/now", b"x"))
    await server.stop(0.05)  # the grace runs out: the request is cancelled
    assert not server.tasks and transport.closing

    assert server.port is None  # the listener is closed


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    return sock
