"""One HTTP/1.1 listener, owned end to end: the accept loop (``loop.create_server`` on a
socket bound by ``server/listeners.py``), the open connections and their request tasks, and
the graceful stop. Connections are ``server/http/connection.py``'s protocol.

Why our own and not uvicorn's ``Server``: its loop was all that was left of uvicorn on the
HTTP port (the protocol was already ours), reached through its internals (``Config``,
``ServerState``, the protocol's constructor signature), which pinned uvicorn below 0.60.
What it did for us fits here: a set of connections, a set of tasks, and ``stop``.

The stop, in order:

1. connections the kernel completed but the loop has not accepted yet are taken in
   (``accept_waiting``): closing the listener would reset them, and their clients may have
   sent a request already;
2. the listener closes: no new connection;
3. every connection is told (``HttpProtocol.shutdown``): a request in flight is answered
   with ``Connection: close``, an idle keep-alive connection closes after a short silence;
4. wait until every connection has closed and every request task has finished, at most
   ``grace_s``; then cancel what is left and close the connections still open.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from typing import Any

from milliserve.server.http.cycle import Express
from milliserve.server.http.listener import ConnectionLimits, Listener
from milliserve.server.listeners import BACKLOG, accept_waiting

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)

# how often the stop looks whether connections and tasks are gone
_POLL_S = 0.02


class HttpServer:
    """An HTTP/1.1 listener serving ``app`` (ASGI) with ``limits``: ``await start(sock)``,
    then ``await stop(grace_s)``. ``protocol``: the connection class (``HttpProtocol`` or a
    subclass of it, e.g. ``wire_timing.timed_protocol``'s); ``express``: the application's
    express lane (``HttpApp.express``), tried first for a small request whose body is in."""

    def __init__(
        self,
        app: Any,
        limits: ConnectionLimits,
        protocol: type[Any],
        what: str = "http",
        express: Express | None = None,
    ) -> None:
        self.app = app
        self.express = express  # the application's express lane (``Cycle.answer_now``), if any
        self.listener = Listener(limits)
        self.protocol = protocol
        self.what = what
        self.connections: set[Any] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        # protocols made by the listener whose connection_made has not run yet: the loop
        # schedules it a turn or two after the accept, and the stop must wait for them too
        self.unmade: weakref.WeakSet[Any] = weakref.WeakSet()  # one whose accept failed is dropped
        self.stopping = False  # a connection made from now on is told at once (``shutdown``)
        self.total_requests = 0
        # every response carries these header lines (keep-alive: how long an idle connection
        # stays); one that closes after it carries them without keep-alive
        self.default_head, self.close_head = self.listener.heads([(b"keep-alive", _timeout(limits))])
        self._server: asyncio.AbstractServer | None = None
        self._sock: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def connection(self) -> asyncio.Protocol:
        """A new connection's protocol (the factory ``create_server`` calls)."""
        protocol: asyncio.Protocol = self.protocol(self)
        self.unmade.add(protocol)
        return protocol

    async def start(self, sock: socket.socket) -> None:
        self.loop = asyncio.get_running_loop()
        self._sock = sock
        self._server = await self.loop.create_server(self.connection, sock=sock, backlog=BACKLOG)

    @property
    def port(self) -> int | None:
        return self._sock.getsockname()[1] if self._sock is not None and self._sock.fileno() >= 0 else None

    async def stop(self, grace_s: float | None) -> None:
        """Stop accepting, let requests in flight finish (at most ``grace_s``; None: no
        bound), then close what is left."""
        server = self._server
        if server is None:
            return
        self._server = None
        self.stopping = True
        taken = await accept_waiting(self._sock, self.connection)
        if taken:
            log.debug("%s: took in %d waiting connection(s) before closing", self.what, taken)
        server.close()
        for conn in list(self.connections):
            conn.shutdown()
        loop = asyncio.get_running_loop()
        end = None if grace_s is None else loop.time() + grace_s
        # connections leave the set from several protocol callbacks (lost, lingering, closed
        # idle): looked at every few ms during the stop rather than signalled from each. One
        # the listener accepted while accept_waiting ran is not in the set yet (``unmade``):
        # missed, the stop returned without it and it served requests while the models
        # unloaded (503 'not ready (UNAVAILABLE: unloaded)', issue 65's CI run)
        while (self.connections or self.tasks or self.unmade) and (end is None or loop.time() < end):  # noqa: ASYNC110
            await asyncio.sleep(_POLL_S)
        if self.tasks:
            log.error(
                "%s: cancelling %d request(s) still running after the grace of %s s",
                self.what,
                len(self.tasks),
                grace_s,
            )
            for task in list(self.tasks):
                task.cancel("the server stopped: its grace for requests in flight ran out")
            await asyncio.gather(*self.tasks, return_exceptions=True)
        for conn in list(self.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.close()
        await server.wait_closed()


def _timeout(limits: ConnectionLimits) -> bytes:
    return limits.keep_alive_header[1].encode("latin-1")
