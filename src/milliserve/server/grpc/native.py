"""milliserve's own gRPC listener: HTTP/2 connections (server/h2/) on the server's event
loop, calls dispatched (calls.py) to the one servicer (servicer.py).

Connections are capped in all and per client address; past a cap a connection gets
GOAWAY at once. ``stop`` sends every connection GOAWAY (calls already sent are served,
none is cancelled), waits for them up to the grace, then closes what is left.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from milliserve.runtime.dataplane import DataPlane
from milliserve.server.auth import Auth
from milliserve.server.grpc.calls import Dispatcher, Method
from milliserve.server.grpc.servicer import SERVICE_NAME, CallCount, service_methods
from milliserve.server.h2.flow import GrantBudget
from milliserve.server.h2.frames import ENHANCE_YOUR_CALM
from milliserve.server.h2.h2_connection import Http2Protocol
from milliserve.server.h2.limits import ConnectionStats, Http2Limits
from milliserve.server.h2.turns import TurnBudget
from milliserve.server.listeners import accept_waiting
from milliserve.server.shm.service import SharedMemoryService

__all__ = ["NativeGrpcServer"]

log = logging.getLogger(__name__)


class NativeGrpcServer:
    """The gRPC port: ``await start(sock)``, then ``await stop(grace)``."""

    def __init__(
        self,
        dataplane: DataPlane,
        limits: Http2Limits,
        offload: Callable[..., Awaitable[Any]],
        auth: Auth | None = None,
        calls: CallCount | None = None,
        max_connections: int = 10_000,
        max_connections_per_peer: int = 1000,
        shm: SharedMemoryService | None = None,
    ) -> None:
        self.calls = calls or CallCount()
        table = service_methods(dataplane, auth or Auth(None), self.calls, shm)
        methods = {
            f"/{SERVICE_NAME}/{name}".encode(): Method(fn, streaming)
            for name, (fn, _, streaming) in table.items()
        }
        self.limits = limits
        self.stats = ConnectionStats()
        self.budget = GrantBudget(limits.max_buffered_bytes)  # shared by every connection
        self.turns = TurnBudget()  # new streams per turn of the loop, over every connection
        self.dispatcher = Dispatcher(methods, offload, limits.max_message_bytes, self._count)
        self.max_connections = max_connections
        self.max_per_peer = max_connections_per_peer
        self.connections: set[Http2Protocol] = set()
        self._per_peer: Counter[str] = Counter()
        self._server: asyncio.AbstractServer | None = None
        self._sock: socket.socket | None = None
        self.refused_connections = 0
        self.stopping = False  # a connection made from now on gets GOAWAY at once
        # protocols made at an accept whose connection_made has not run yet (the loop
        # schedules it a turn or two later): the stop waits for them too
        self.unmade: weakref.WeakSet[Http2Protocol] = weakref.WeakSet()

    def figures(self) -> dict[str, int]:
        """Open connections and the connection counters, for the metrics."""
        st = self.stats
        return {
            "connections": len(self.connections),
            "unread_cancelled": st.unread_cancelled,
            "resets_received": st.resets_received,
            "refused_streams": st.refused_streams,
            "goaway_calm": st.goaway_calm,
            "protocol_errors": st.protocol_errors,
            "refused_connections": self.refused_connections,
        }

    def _count(self) -> None:
        self.calls.started += 1

    def _protocol(self) -> Http2Protocol:
        protocol = _Tracked(self)
        self.unmade.add(protocol)
        return protocol

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._sock = sock
        self._server = await loop.create_server(self._protocol, sock=sock, backlog=2048)

    async def stop(self, grace: float) -> None:
        """Stop accepting; let every call already sent finish (up to ``grace`` s)."""
        # the connections in the backlog (with --workers each worker has its own, on the
        # shared port): taken in and sent GOAWAY below, rather than reset by the close
        await accept_waiting(self._sock, self._protocol)
        if self._server is not None:
            self._server.close()
        self.stopping = True
        for conn in list(self.connections):
            conn.goaway()
        # a connection accepted just before the close is made a turn of the loop later (its
        # connection_made is scheduled): it gets GOAWAY there, and is waited for like the rest.
        # Missed, it served calls while the models unloaded ('not ready (UNLOADING)')
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        waited: set[Http2Protocol] = set()
        await asyncio.sleep(0)
        while self.unmade and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        while (todo := [c for c in self.connections if c not in waited]) and loop.time() < deadline:
            waited.update(todo)
            waits = [asyncio.ensure_future(conn.drain()) for conn in todo]
            _, pending = await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()))
            for w in pending:
                w.cancel()
        for conn in list(self.connections):
            conn.close()
        running = list(self.dispatcher.running)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()


class _Tracked(Http2Protocol):
    """A connection that the server counts, in all and per peer address."""

    def __init__(self, server: NativeGrpcServer) -> None:
        super().__init__(
            server.dispatcher, server.limits, server.stats, self._gone, server.budget, server.turns
        )
        self._owner = server
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = peer[0] if peer else ""
        s = self._owner
        s.unmade.discard(self)
        if len(s.connections) >= s.max_connections or s._per_peer[address] >= s.max_per_peer:
            s.refused_connections += 1
            super().connection_made(transport)
            self.goaway(ENHANCE_YOUR_CALM, b"too many connections")
            return
        s.connections.add(self)
        s._per_peer[address] += 1
        self._counted = True
        super().connection_made(transport)
        if s.stopping:
            self.goaway()

    def _gone(self, conn: Http2Protocol) -> None:
        if not self._counted:
            return
        s = self._owner
        s.connections.discard(self)
        s._per_peer[self.peer] -= 1
        if s._per_peer[self.peer] <= 0:
            del s._per_peer[self.peer]
