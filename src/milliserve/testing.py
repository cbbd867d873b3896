"""Helpers for testing against milliserve: free ports, a server in a subprocess, a server
in this process, a real Redis, a shared-memory object as a client makes one, and waiting
for a condition. Public, so users' own tests can use them too (as ``starlette.testclient``);
what only milliserve's own suite needs is in ``tests/support``."""

from __future__ import annotations

import asyncio
import inspect
import mmap
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from milliserve.config.settings import GrpcSettings, HttpSettings, MetricsSettings, Settings
from milliserve.server.assembly import Server

__all__ = [
    "InProcessServer",
    "RedisServer",
    "ServerProcess",
    "SharedMemoryObject",
    "free_port",
    "wait_until",
    "wait_until_async",
]


def wait_until(
    condition: Callable[[], object],
    timeout_s: float = 30.0,
    what: str = "condition",
    interval_s: float = 0.005,
) -> float:
    """Poll ``condition`` until it holds; the seconds waited. AssertionError naming ``what``
    after ``timeout_s``. A sleep sized for an idle machine is too short on a loaded CI
    machine and wasted on an idle one: wait for the condition instead."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what} did not hold within {timeout_s:g} s")
        time.sleep(interval_s)
    return time.monotonic() - start


async def wait_until_async(
    condition: Callable[[], object] | Callable[[], Awaitable[object]],
    timeout_s: float = 30.0,
    what: str = "condition",
    interval_s: float = 0.005,
) -> float:
    """As ``wait_until``, inside an event loop; ``condition`` may be a coroutine function."""
    start = time.monotonic()
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what} did not hold within {timeout_s:g} s")
        await asyncio.sleep(interval_s)


# every port free_port() has returned in this process
_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, and that no earlier call in this
    process returned: the kernel may hand a port it just gave out to the next ``bind`` again
    (the tutorial test's gRPC port and Redis port were once the same, and the server it
    started could not listen)."""
    while True:
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class ServerProcess:
    """``milliserve serve`` in a subprocess on free loopback ports.

    Use as a context manager: it waits for ``/v2/health/ready`` and, on exit,
    sends SIGTERM to the PID and waits for a clean exit.
    """

    def __init__(
        self,
        repository: Path,
        *extra_args: str,
        ready_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """``headers`` go with the readiness poll (a token, when health is closed)."""
        self.repository = repository
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.extra_args = extra_args
        self.ready_timeout_s = ready_timeout_s
        self.env = env
        self.headers = headers or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "milliserve",
            "serve",
            str(self.repository),
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            *self.extra_args,
        ]
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"milliserve-{self.http_port}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.ready_timeout_s
        ready = urllib.request.Request(f"http://{self.http_url}/v2/health/ready", headers=self.headers)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(ready, timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"server not ready after {self.ready_timeout_s}s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM the server and wait; returns its exit code (kills it after ``timeout_s``)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class InProcessServer:
    """A Server in this process's running event loop (``async with``).

    With ``listen=False`` no port is opened: use ``server.http_app()`` with
    ``httpx.ASGITransport`` for fast in-process HTTP tests.
    """

    def __init__(
        self,
        repository: Path,
        model_control_mode: Literal["none", "explicit"] = "none",
        listen: bool = True,
        max_request_bytes: int = 1 << 20,
        **settings: Any,
    ) -> None:
        """``settings`` are further fields of ``Settings`` (e.g. ``strict_readiness=False``)."""
        self.settings = Settings(
            model_repository=repository,
            http=HttpSettings(port=free_port(), enabled=listen, max_request_bytes=max_request_bytes),
            grpc=GrpcSettings(port=free_port(), enabled=listen),
            metrics=MetricsSettings(port=free_port(), enabled=listen),
            model_control_mode=model_control_mode,
            shutdown_grace_s=5,
            **settings,
        )
        self.server = Server(self.settings)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.http.port}"

    async def __aenter__(self) -> Server:
        await self.server.start()
        return self.server

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.shield(self.server.stop())


class RedisServer:
    """A real ``redis-server`` on a free loopback port, without persistence; stopped by PID.

    ``stop()`` and ``start()`` can be called again to drill an outage on the same port.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        cmd = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",  # DEBUG SLEEP, for the slow-Redis drills
            "local",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class SharedMemoryObject:
    """A POSIX shared-memory object (Linux ``/dev/shm``), as a client of the shared-memory
    extension makes one: created here (never an existing one), read and written through
    ``buf``, unlinked by ``close`` (or the ``with`` block's end)."""

    def __init__(self, key: str, size: int) -> None:
        if not key.startswith("/") or "/" in key[1:]:
            raise ValueError(f"{key!r} is not a POSIX shared-memory name like '/name'")
        self.key = key
        self.path = Path("/dev/shm") / key[1:]
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self.buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def write(self, data: bytes, offset: int = 0) -> None:
        self.buf[offset : offset + len(data)] = data

    def read(self, size: int, offset: int = 0) -> bytes:
        return bytes(self.buf[offset : offset + size])

    def close(self) -> None:
        if not self.buf.closed:
            self.buf.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SharedMemoryObject:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
