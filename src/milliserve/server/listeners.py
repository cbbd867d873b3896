"""The listening ports, bound before anything starts, so that a port in use is a one-line
error that names it, before any model loads (issue 10).

Sockets get SO_REUSEADDR (a restart may bind while its predecessor's connections sit
in TIME_WAIT) and never SO_REUSEPORT: a second server on the same port must fail, not
share the port and take half its calls. The workers of ``serve --workers N`` share ports
on purpose: their parent binds the HTTP and metrics sockets once and hands them down, and
holds the gRPC port, which the workers' gRPC servers share with SO_REUSEPORT.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from milliserve.errors import ConfigError

__all__ = [
    "BACKLOG",
    "GRPC",
    "HTTP",
    "METRICS",
    "Listener",
    "WorkerSlot",
    "accept_waiting",
    "bind_grpc",
    "bind_tcp",
    "inherited",
]

# pending connections the kernel queues before accept
BACKLOG = 2048


@dataclass(frozen=True, slots=True)
class Listener:
    """Which port: its name in messages and the flag that changes it."""

    name: str
    flag: str


HTTP = Listener("HTTP", "--http-port")
GRPC = Listener("gRPC", "--grpc-port")
METRICS = Listener("metrics", "--metrics-port")


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """One worker of ``serve --workers N``: the listening sockets its parent bound (file
    descriptors it inherited), the gRPC port it shares through SO_REUSEPORT, its private
    port (and its siblings'), and whether to accept before its models are ready (the first
    worker of a fresh start does, so health answers while it loads; the others, and any
    restarted worker, join only once warm)."""

    index: int
    http_fd: int | None
    metrics_fd: int | None
    peer_fd: int
    grpc_port: int | None
    peer_ports: tuple[int, ...]
    accept_early: bool
    ready_fd: int | None


def inherited(fd: int) -> socket.socket:
    """A listening socket from a file descriptor this process inherited."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def _bind_error(listener: Listener, host: str, port: int, exc: OSError) -> ConfigError:
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"the {listener.name} port {port} on {host} is already in use (another server?); "
            f"choose another with {listener.flag}"
        )
    reason = exc.strerror or str(exc)
    return ConfigError(f"cannot listen on {host} port {port} for {listener.name}: {reason}")


def bind_tcp(host: str, port: int, listener: Listener, shared: bool = False) -> socket.socket:
    """A bound, listening, non-blocking socket on ``host:port`` (port 0: any free port).
    ``shared``: with SO_REUSEPORT, for the workers of ``serve --workers N`` (gRPC).

    Raises ConfigError naming the port and the listener when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise _bind_error(listener, host, port, exc) from None
    return sock


def bind_grpc(server: Any, host: str, port: int, shared: bool = False) -> int:
    """Add the insecure port to a grpc.aio server (built with ``grpc.so_reuseport`` 0) and
    return the port bound. Raises ConfigError naming the port when it cannot be had.

    grpc core does not say why a bind failed (and logs its own lines), so the port is
    tried here first with a plain socket."""
    if port != 0 and not shared:  # a shared port is held (SO_REUSEPORT) by the workers' parent
        bind_tcp(host, port, GRPC).close()
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = int(server.add_insecure_port(address))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ConfigError(f"cannot listen on {host} port {port} for gRPC (grpc could not bind {address})")
    return bound


async def accept_waiting(sock: socket.socket | None, protocol: Callable[[], asyncio.Protocol]) -> int:
    """Accept the connections waiting in ``sock``'s backlog, with ``protocol``; returns how
    many. Call it right before the listener closes: a connection the kernel completed but
    nobody accepted is reset at the close, and its client may have sent a request on it
    already (lost: it cannot tell whether it ran). Under ``--workers`` a busy worker leaves
    such connections behind. The caller closes the listener before it awaits anything else."""
    if sock is None or sock.fileno() < 0:
        return 0
    loop = asyncio.get_running_loop()
    total = 0
    while True:
        accepted = []
        for _ in range(1024):
            try:
                conn, _ = sock.accept()
            except OSError:  # BlockingIOError: none waiting
                break
            conn.setblocking(False)
            accepted.append(loop.connect_accepted_socket(protocol, conn))
        if not accepted:
            return total
        total += len(accepted)
        await asyncio.gather(*accepted, return_exceptions=True)
