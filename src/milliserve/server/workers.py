"""``milliserve serve --workers N``: N processes behind the same ports, one parent.

Python's interpreter lock caps one process (docs/design.md, known limits); workers add
processes on one machine. The parent:

- binds the HTTP and metrics sockets once and hands them to every worker (the kernel gives
  each new connection to whichever worker accepts first), and holds the gRPC port with
  SO_REUSEPORT, which the workers' gRPC servers share (grpc core binds its own sockets);
- gives each worker a private port on 127.0.0.1, where siblings ask it for its metrics
  and statistics, so any worker answers for all (metrics with a ``worker`` label,
  statistics summed);
- starts the first worker accepting at once (health answers while it loads) and the others
  only once their models are warm; a worker that dies is restarted, with backoff, and
  joins the ports only when warm, so no request waits on a cold start;
- on SIGTERM or SIGINT stops listening and passes the signal on: each worker drains what it
  holds, as a lone server does. A worker still running after the grace period is killed.

Each worker is ``python -m milliserve.server.worker_process``, reading its settings and its
slot (the inherited descriptors) as JSON on stdin, so no secret goes through the environment.
The worker's side lives in that module: it builds a ``Server`` (server/assembly.py), which imports
this one for ``serve --workers``, so the two sides apart keep the imports one way.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from milliserve.config.settings import Settings
from milliserve.errors import ConfigError
from milliserve.server.listeners import GRPC, HTTP, METRICS, Listener, WorkerSlot, bind_tcp

__all__ = ["serve_workers"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
STEADY_S = 60.0  # a worker up this long has its backoff reset


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _guard_port(host: str, port: int, listener: Listener) -> socket.socket:
    """Hold ``port`` with SO_REUSEPORT without listening: the workers' gRPC servers may
    share it; a program without SO_REUSEPORT gets 'address in use'. (One that sets it, as
    the same user, could still join later: the kernel allows that.)"""
    if port != 0:  # anything on the port already (a SO_REUSEPORT server too) refuses this bind
        bind_tcp(host, port, listener).close()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        # the same message a lone server gives
        bind_tcp(host, port, listener).close()
        raise ConfigError(f"cannot hold {listener.name} port {port} on {host}: {exc}") from None
    return sock


def _settings_json(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json")
    data["workers"] = 1
    token = settings.auth.token
    data["auth"]["token"] = token.get_secret_value() if token is not None else None
    return data


@dataclass
class _Worker:
    index: int
    peer: socket.socket
    proc: subprocess.Popen[bytes] | None = None
    ready_r: int | None = None
    ready: bool = False
    started_at: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    ever_ready: bool = False
    peer_port: int = 0


class _Supervisor:
    def __init__(self, settings: Settings) -> None:
        if settings.model_control_mode == "explicit":
            raise ConfigError(
                "--model-control-mode explicit loads and unloads models in one process: it does "
                "not work with --workers (each worker has its own models); use one or the other"
            )
        if settings.shared_memory.mode != "off":
            raise ConfigError(
                "--shared-memory registers regions in one process: it does not work with "
                "--workers (a client's next call may reach another worker); use one or the other"
            )
        self.settings = settings
        s = settings
        self.http = bind_tcp(s.host, s.http.port, HTTP) if s.http.enabled else None
        self.metrics = bind_tcp(s.host, s.metrics.port, METRICS) if s.metrics.enabled else None
        self.grpc = _guard_port(s.host, s.grpc.port, GRPC) if s.grpc.enabled else None
        self.workers = [
            _Worker(i, bind_tcp("127.0.0.1", 0, Listener(f"worker {i} private", "")))
            for i in range(s.workers)
        ]
        for w in self.workers:
            w.peer_port = w.peer.getsockname()[1]
        self.stopping = False
        for sock in (self.http, self.metrics):
            if sock is not None:
                sock.set_inheritable(True)

    def ports(self) -> str:
        def port(sock: socket.socket | None) -> str:
            return str(sock.getsockname()[1]) if sock is not None else "off"

        return f"http {port(self.http)}, grpc {port(self.grpc)}, metrics {port(self.metrics)}"

    def spawn(self, w: _Worker, accept_early: bool) -> None:
        if w.peer.fileno() == -1:  # closed when it died: the same port again, for its siblings
            private = Listener(f"worker {w.index} private", "")
            try:
                w.peer = bind_tcp("127.0.0.1", w.peer_port, private)
            except ConfigError:  # taken meanwhile: its siblings will miss it until they restart
                w.peer = bind_tcp("127.0.0.1", 0, private)
                log.warning(
                    "worker %d: private port %d taken, now %d", w.index, w.peer_port, w.peer.getsockname()[1]
                )
                w.peer_port = w.peer.getsockname()[1]
        ready_r, ready_w = os.pipe()
        w.peer.set_inheritable(True)
        slot = WorkerSlot(
            index=w.index,
            http_fd=self.http.fileno() if self.http is not None else None,
            metrics_fd=self.metrics.fileno() if self.metrics is not None else None,
            peer_fd=w.peer.fileno(),
            grpc_port=self.grpc.getsockname()[1] if self.grpc is not None else None,
            peer_ports=tuple(x.peer_port for x in self.workers),
            accept_early=accept_early,
            ready_fd=ready_w,
        )
        fds = [fd for fd in (slot.http_fd, slot.metrics_fd, slot.peer_fd, ready_w) if fd is not None]
        spec = json.dumps({"settings": _settings_json(self.settings), "slot": asdict(slot)}).encode()
        w.proc = subprocess.Popen(
            [sys.executable, "-m", "milliserve.server.worker_process"],
            stdin=subprocess.PIPE,
            pass_fds=fds,
            preexec_fn=_die_with_parent,
        )
        os.close(ready_w)
        assert w.proc.stdin is not None
        w.proc.stdin.write(spec)
        w.proc.stdin.close()
        w.ready_r, w.ready, w.started_at = ready_r, False, time.monotonic()
        log.info(
            "worker %d: started (pid %d)%s", w.index, w.proc.pid, "" if accept_early else ", joins when warm"
        )

    def _serving(self) -> int:
        return sum(1 for w in self.workers if w.ready and w.proc is not None and w.proc.poll() is None)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        log.info("%d workers on %s: %s", len(self.workers), self.settings.host, self.ports())
        for w in self.workers:
            self.spawn(w, accept_early=w.index == 0)
        code = 0
        while not self.stopping:
            self._watch_ready()
            code = self._watch_exits()
            if code:
                break
        self._drain()
        return code

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _watch_ready(self) -> None:
        fds = [w.ready_r for w in self.workers if w.ready_r is not None]
        try:
            readable, _, _ = select.select(fds, [], [], 0.1)
        except InterruptedError:
            return
        for w in self.workers:
            if w.ready_r in readable:
                got = os.read(w.ready_r, 1)
                os.close(w.ready_r)
                w.ready_r = None
                if got == b"R":
                    w.ready = w.ever_ready = True
                    log.info("worker %d: serving", w.index)

    def _watch_exits(self) -> int:
        now = time.monotonic()
        for w in self.workers:
            if w.proc is None:
                if now >= w.next_start and not self.stopping:
                    self.spawn(w, accept_early=self._serving() == 0)
                continue
            rc = w.proc.poll()
            if rc is None:
                if w.ready and now - w.started_at > STEADY_S:
                    w.restarts = 0
                continue
            if w.ready_r is not None:
                os.close(w.ready_r)
                w.ready_r = None
            if not w.ever_ready:  # it never served: a configuration error, not a crash
                log.error("worker %d exited with %s before it served: stopping", w.index, rc)
                return 1
            delay = BACKOFF_S[min(w.restarts, len(BACKOFF_S) - 1)]
            log.warning("worker %d exited with %s: restarting in %.1f s", w.index, rc, delay)
            # siblings asking a dead worker get 'refused' at once, not a queued connection
            w.peer.close()
            w.proc, w.ready, w.next_start = None, False, now + delay
            w.restarts += 1
        return 0

    def _drain(self) -> None:
        # stop listening here first: once the workers close theirs, nothing accepts anymore
        for sock in (self.http, self.metrics, self.grpc):
            if sock is not None:
                sock.close()
        running = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        log.info("draining %d workers", len(running))
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_grace_s + 10
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not stop within the grace period: killed", proc.pid)
                proc.kill()
                proc.wait()
        for w in self.workers:
            w.peer.close()
        log.info("stopped")


def serve_workers(settings: Settings) -> int:
    """Run ``settings.workers`` worker processes until SIGTERM/SIGINT; the exit code."""
    return _Supervisor(settings).run()
