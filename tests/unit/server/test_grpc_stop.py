"""The gRPC listener's stop: a connection made after the stop began gets GOAWAY at once,
with last-stream-id 0: none of its calls is taken.

uvloop makes an accepted connection a turn of the loop later (its ``connection_made`` is
scheduled), so one accepted just before the listener closed was missing from the list of
connections that got GOAWAY: it served calls while the models unloaded, and its clients got
'not ready (UNLOADING)' (the SIGTERM drill with two workers, about one run in 25). Here the
late connection is made by hand, right after the stop began, on a real socket."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from milliserve.runtime.dataplane import DataPlane
from milliserve.server.grpc.native import NativeGrpcServer
from milliserve.server.h2.frames import GOAWAY
from milliserve.server.h2.limits import Http2Limits


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _frame_types(data: bytes) -> list[int]:
    kinds, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        kinds.append(data[at + 3])
        at += 9 + length
    return kinds


def _last_stream(data: bytes) -> int:
    at = 0
    while data[at + 3] != GOAWAY:
        at += 9 + int.from_bytes(data[at : at + 3], "big")
    return int(struct.unpack(">L", data[at + 9 : at + 13])[0] & 0x7FFFFFFF)


def test_a_connection_made_after_the_stop_began_gets_goaway() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = NativeGrpcServer(DataPlane(None, False), Http2Limits(), _offload)  # type: ignore[arg-type]
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        await server.start(listener)
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        stopping = asyncio.create_task(server.stop(grace=10.0))
        await asyncio.sleep(0)  # the stop has closed the listener and sent its GOAWAYs (to none)
        await loop.connect_accepted_socket(server._protocol, ours)  # made late
        theirs.settimeout(10)
        got = b""
        while GOAWAY not in _frame_types(got):
            chunk = await loop.run_in_executor(None, theirs.recv, 65536)
            assert chunk, f"closed without GOAWAY: frames {_frame_types(got)}"
            got += chunk
        assert _frame_types(got).index(GOAWAY) >= 1  # after the server's SETTINGS
        assert _last_stream(got) == 0  # no stream of it is taken
        theirs.close()  # the client goes, as a gRPC client does after GOAWAY
        await asyncio.wait_for(stopping, 30)
        for _ in range(1000):  # its close reaches the server
            if not server.connections:
                break
            await asyncio.sleep(0.01)
        assert not server.connections
        ours.close()
        listener.close()

    asyncio.run(main())
