"""The HTTP listener's stop waits for a connection accepted while it began: the loop makes
such a connection (``connection_made``) a turn or two after the accept. Missed, the stop
returned without it, the models unloaded, and the requests on it were answered 503 'not
ready (UNAVAILABLE: unloaded)' (the drain drill under ``--workers 2``, issue 65's CI run)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from milliserve.server.http.connection import HttpProtocol
from milliserve.server.http.listener import ConnectionLimits
from milliserve.server.http.server import HttpServer

LIMITS = ConnectionLimits(
    max_header_bytes=16384, header_timeout_s=5.0, body_timeout_s=5.0, keep_alive_s=5.0, max_connections=64
)


async def ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(v)
        for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
        if k.lower() == b"content-length"
    )
    return head + await reader.readexactly(length)


def test_a_connection_made_after_the_stop_began_is_waited_for_and_told_to_close() -> None:
    async def run() -> tuple[bool, bytes, bytes]:
        listening = socket.create_server(("127.0.0.1", 0))
        listening.setblocking(False)
        server = HttpServer(ok_app, LIMITS, HttpProtocol)
        await server.start(listening)
        # a connection the listener has accepted but the loop has not made yet: its
        # protocol exists (the factory ran), its connection_made comes later
        ours, theirs = socket.socketpair()
        late = server.connection()
        stop = asyncio.ensure_future(server.stop(grace_s=30.0))
        for _ in range(5):
            await asyncio.sleep(0.02)
        waited = not stop.done()
        loop = asyncio.get_running_loop()
        theirs.setblocking(False)
        await loop.connect_accepted_socket(lambda: late, theirs)
        reader, writer = await asyncio.open_connection(sock=ours)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = await read_answer(reader)
        rest = await reader.read()  # the server closes the connection after that answer
        writer.close()
        await asyncio.wait_for(stop, 30.0)
        return waited, answer, rest

    waited, answer, rest = asyncio.run(run())
    assert waited, "the stop returned before the connection accepted at its start was made"
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), answer
    assert b"connection: close" in answer.lower(), answer
    assert rest == b""
