"""A minimal Open Inference Protocol server with a latency distribution you choose.

Used to calibrate ``milliserve bench`` (with zero latency it measures the tool's
own overhead) and to test it against a known truth::

    python -m milliserve.bench.fake_server --port 9000 --latency-ms 1 --slow-every 100 --slow-ms 50

It serves one model (``fake``, input ``x`` FP32 [-1, 4], output ``y``) over HTTP/1.1
keep-alive, answers every infer with the same small JSON body after the chosen
delay, and can fail every Nth request or stall every request that arrives in a
time window. Plain asyncio, no framework: its own cost stays in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "FakeBehaviour",
    "HttpHandler",
    "fake_server_process",
    "module_server_process",
    "run_until_interrupted",
    "serve_fake",
]

METADATA = orjson.dumps(
    {
        "name": "fake",
        "versions": ["1"],
        "platform": "fake",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
)
CONFIG = orjson.dumps({"name": "fake", "max_batch_size": 64})
SERVER = orjson.dumps({"name": "fake", "version": "0", "extensions": []})
STATS = orjson.dumps({"model_stats": []})
ANSWER = orjson.dumps(
    {
        "model_name": "fake",
        "model_version": "1",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [0.0, 0.0, 0.0, 0.0]}],
    }
)


@dataclass(frozen=True)
class FakeBehaviour:
    latency_ms: float = 0.0
    slow_every: int = 0  # every Nth infer takes slow_ms instead
    slow_ms: float = 0.0
    error_every: int = 0  # every Nth infer fails with error_status
    error_status: int = 503
    stall_after_s: float = -1.0  # requests arriving in [after, after + stall_ms) wait until its end
    stall_ms: float = 0.0


def _response(status: int, body: bytes, reason: str = "OK") -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class HttpHandler(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive connection for the fake servers: requests framed by
    Content-Length are queued and answered in order by ``answer`` (its False closes)."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.queue: asyncio.Queue[tuple[str, str, bytes]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < end + 4 + length:
                return
            method, path = head.split(" ", 2)[:2]
            self.queue.put_nowait((method, path, self.buf[end + 4 : end + 4 + length]))
            self.buf = self.buf[end + 4 + length :]

    async def _serve(self) -> None:
        while True:
            method, path, body = await self.queue.get()
            if not await self.answer(method, path, body):
                return

    async def answer(self, method: str, path: str, body: bytes) -> bool:
        raise NotImplementedError


class _Handler(HttpHandler):
    def __init__(self, behaviour: FakeBehaviour, state: dict[str, float]) -> None:
        super().__init__()
        self.b = behaviour
        self.state = state

    async def answer(self, method: str, path: str, body: bytes) -> bool:
        if method == "POST" and path.endswith("/infer"):
            self.transport.write(await self._infer())
        elif path.rstrip("/").endswith("/config"):
            self.transport.write(_response(200, CONFIG))
        elif path.rstrip("/").endswith("/stats"):
            self.transport.write(_response(200, STATS))
        elif path.rstrip("/") == "/v2":
            self.transport.write(_response(200, SERVER))
        elif path.startswith("/v2/models/fake"):
            self.transport.write(_response(200, b"{}" if path.endswith("/ready") else METADATA))
        elif path.startswith("/v2/health"):
            self.transport.write(_response(200, b"{}"))
        else:
            self.transport.write(_response(404, b'{"error": "unknown model"}', "Not Found"))
        return True

    async def _infer(self) -> bytes:
        b = self.b
        n = int(self.state["count"]) + 1
        self.state["count"] = n
        arrived = time.monotonic() - self.state["start"]
        delay = b.latency_ms
        if b.slow_every and n % b.slow_every == 0:
            delay = b.slow_ms
        if b.stall_after_s >= 0 and b.stall_after_s <= arrived < b.stall_after_s + b.stall_ms / 1e3:
            delay += (b.stall_after_s + b.stall_ms / 1e3 - arrived) * 1e3
        if delay > 0:
            await asyncio.sleep(delay / 1e3)
        if b.error_every and n % b.error_every == 0:
            return _response(b.error_status, b'{"error": "fake overload"}', "Service Unavailable")
        return _response(200, ANSWER)


async def serve_fake(port: int, behaviour: FakeBehaviour, host: str = "127.0.0.1") -> None:
    """Serve until cancelled."""
    loop = asyncio.get_running_loop()
    state = {"count": 0.0, "start": time.monotonic()}
    server = await loop.create_server(lambda: _Handler(behaviour, state), host, port)
    async with server:
        await server.serve_forever()


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def module_server_process(module: str, health: str, what: str, *args: str) -> Iterator[str]:
    """Run ``python -m module --port P *args`` on a free loopback port; yields its base URL
    once ``health`` answers, and stops it on exit."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}{health}", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the {what} did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def fake_server_process(*args: str) -> Iterator[str]:
    """Run the fake server in a subprocess on a free loopback port (command-line ``args`` as
    for ``main``); yields its base URL once it answers, and stops it on exit."""
    with module_server_process(
        "milliserve.bench.fake_server", "/v2/health/ready", "fake OIP server", *args
    ) as url:
        yield url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    for name in ("latency-ms", "slow-ms", "stall-ms"):
        ap.add_argument(f"--{name}", type=float, default=0.0)
    ap.add_argument("--stall-after-s", type=float, default=-1.0)
    for name in ("slow-every", "error-every"):
        ap.add_argument(f"--{name}", type=int, default=0)
    ap.add_argument("--error-status", type=int, default=503)
    a = ap.parse_args()
    behaviour = FakeBehaviour(
        a.latency_ms, a.slow_every, a.slow_ms, a.error_every, a.error_status, a.stall_after_s, a.stall_ms
    )
    run_until_interrupted(serve_fake(a.port, behaviour))


def run_until_interrupted(server: Coroutine[Any, Any, None]) -> None:
    """A fake server's main: serve on uvloop until SIGINT (or the parent's SIGTERM)."""
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(server)


if __name__ == "__main__":
    main()
