"""The load generator's worker processes.

Each worker runs its own uvloop and its own connections, and answers jobs from
the parent: "keep N requests in flight" (closed loop) or "send at these
instants" (open loop). Every request is recorded with the instant it was
*scheduled*, the instant it went out, and the instant its answer arrived, all
on the system-wide monotonic clock, so the parent can measure open-loop latency
from the schedule (coordinated omission corrected) and count late sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

import numpy as np

from milliserve.bench.workload import Workload

__all__ = ["CONNECT_ERROR", "Job", "ProcessPool", "Records", "WorkerPool"]

CONNECT_ERROR = -1
R = TypeVar("R")


@dataclass(frozen=True)
class Job:
    mode: str  # "closed" or "open"
    level: float  # this worker's concurrency (closed) or requests per second (open)
    start_at: float  # time.monotonic() instant shared by all workers
    duration_s: float  # includes the warmup
    poisson: bool = True
    seed: int = 0
    warmup_s: float = 0.0  # LLM mode: requests scheduled before start_at + warmup_s are not measured
    requests: int | None = None  # LLM mode: measure this many requests instead of duration_s


@dataclass
class Records:
    intended: np.ndarray[Any, Any]
    sent: np.ndarray[Any, Any]
    done: np.ndarray[Any, Any]
    status: np.ndarray[Any, Any]  # HTTP status, 1000 + gRPC code, or -1 for a connection error
    messages: dict[int, str] = field(default_factory=dict)  # first error message per status
    cpu_s: float = 0.0

    @staticmethod
    def merge(parts: list[Records]) -> Records:
        messages: dict[int, str] = {}
        for p in parts:
            for k, v in p.messages.items():
                messages.setdefault(k, v)
        return Records(
            np.concatenate([p.intended for p in parts]),
            np.concatenate([p.sent for p in parts]),
            np.concatenate([p.done for p in parts]),
            np.concatenate([p.status for p in parts]),
            messages,
            sum(p.cpu_s for p in parts),
        )


class _Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, int]] = []
        self.messages: dict[int, str] = {}

    def add(self, intended: float, sent: float, done: float, status: int, message: str = "") -> None:
        self.rows.append((intended, sent, done, status))
        if message and status not in self.messages:
            self.messages[status] = message[:300]

    def records(self, cpu_s: float) -> Records:
        a = np.asarray(self.rows, dtype=np.float64).reshape(-1, 4)
        return Records(a[:, 0], a[:, 1], a[:, 2], a[:, 3].astype(np.int32), self.messages, cpu_s)


class _HttpConn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        # when the server will close the idle connection (its Keep-Alive: timeout=N, less a
        # second): reusing it later would race the server's close and fail the request
        self.expires = math.inf

    async def request(self, parts: tuple[bytes, ...]) -> tuple[int, bytes]:
        if self.writer is not None and time.monotonic() >= self.expires:
            self.close()
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.expires = math.inf
        for part in parts:  # each write goes out at once (TCP_NODELAY): one send per part
            self.writer.write(part)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        lower = head.lower()
        i = lower.find(b"\r\ncontent-length:")  # not Inference-Header-Content-Length
        if i >= 0:
            length = int(lower[i + 17 : lower.index(b"\r\n", i + 2)])
        body = await self.reader.readexactly(length) if length else b""
        if b"connection: close" in lower:
            self.close()
        elif (k := lower.find(b"\r\nkeep-alive: timeout=")) >= 0:
            end = lower.index(b"\r\n", k + 2)
            with contextlib.suppress(ValueError):
                self.expires = time.monotonic() + float(lower[k + 22 : end].split(b",")[0]) - 1.0
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _raw_http(w: Workload) -> list[tuple[bytes, ...]]:
    out: list[tuple[bytes, ...]] = []
    for body, headers in zip(w.bodies, w.headers, strict=True):
        head = f"POST {w.path} HTTP/1.1\r\nHost: {w.target.host}:{w.target.port}\r\n"
        head += f"Content-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        out.append((head.encode(), body) if w.split_writes else (head.encode() + body,))
    return out


class _Sender:
    """Sends one request and records it; HTTP keeps a pool of keep-alive connections."""

    def __init__(self, w: Workload, rec: _Recorder) -> None:
        self.w, self.rec = w, rec
        self.n = 0
        self.idle: list[_HttpConn] = []
        self.raw = _raw_http(w) if w.target.protocol == "http" else [(b,) for b in w.bodies]
        self.grpc_call: Any = None
        self.channel: Any = None

    async def start(self) -> None:
        if self.w.target.protocol == "grpc":
            import grpc

            self.channel = grpc.aio.insecure_channel(f"{self.w.target.host}:{self.w.target.port}")
            self.grpc_call = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    async def stop(self) -> None:
        for c in self.idle:
            c.close()
        if self.channel is not None:
            await self.channel.close()

    async def send(self, intended: float) -> None:
        parts = self.raw[self.n % len(self.raw)]
        self.n += 1
        sent = time.monotonic()
        if self.grpc_call is not None:
            import grpc

            try:
                await self.grpc_call(parts[0], timeout=60)
                self.rec.add(intended, sent, time.monotonic(), 200)
            except grpc.aio.AioRpcError as exc:
                self.rec.add(
                    intended, sent, time.monotonic(), 1000 + exc.code().value[0], exc.details() or ""
                )
            return
        conn = self.idle.pop() if self.idle else _HttpConn(self.w.target.host, self.w.target.port)
        try:
            status, resp = await conn.request(parts)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            conn.close()
            self.rec.add(intended, sent, time.monotonic(), CONNECT_ERROR, f"{type(exc).__name__}: {exc}")
            return
        done = time.monotonic()
        self.idle.append(conn)
        if status == 200:
            self.rec.add(intended, sent, done, 200)
        else:
            self.rec.add(intended, sent, done, status, resp.decode(errors="replace"))


async def _closed(s: _Sender, job: Job) -> None:
    end = job.start_at + job.duration_s

    async def loop() -> None:
        while (now := time.monotonic()) < end:
            await s.send(now)

    await asyncio.sleep(max(0.0, job.start_at - time.monotonic()))
    await asyncio.gather(*(loop() for _ in range(int(job.level))))


async def _open(s: _Sender, job: Job) -> None:
    """Send at the scheduled instants. Event-loop timers have millisecond resolution, so a
    small thread sleeps to each instant with nanosleep (microsecond precision, no busy
    wait) and hands the send to the loop; what lateness remains is recorded."""
    rng = np.random.default_rng(job.seed)
    n = int(job.level * job.duration_s) + 1
    gaps = rng.exponential(1 / job.level, n) if job.poisson else np.full(n, 1 / job.level)
    instants = job.start_at + np.cumsum(gaps) - gaps[0]
    end = job.start_at + job.duration_s
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    finished = asyncio.Event()

    def fire(t: float) -> None:
        task = loop.create_task(s.send(t))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def schedule() -> None:
        for t in instants:
            if t >= end:
                break
            delay = t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            loop.call_soon_threadsafe(fire, float(t))
        loop.call_soon_threadsafe(finished.set)

    clock = threading.Thread(target=schedule, name="bench-schedule", daemon=True)
    clock.start()
    await finished.wait()
    clock.join()
    while tasks:
        await asyncio.gather(*tasks)


async def _run(w: Workload, job: Job) -> Records:
    rec = _Recorder()
    s = _Sender(w, rec)
    await s.start()
    cpu0 = time.process_time()
    try:
        await (_closed(s, job) if job.mode == "closed" else _open(s, job))
    finally:
        await s.stop()
    return rec.records(time.process_time() - cpu0)


def _worker_main(
    conn: Connection, workload: Any, runner: Callable[[Any, Job], Coroutine[Any, Any, Any]]
) -> None:
    import uvloop

    conn.send("ready")  # imports are done: the parent may now schedule on tight instants
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(uvloop.run(runner(workload, job)))


class ProcessPool(Generic[R]):
    """``size`` worker processes that keep running between jobs; each runs ``runner``
    (a module-level coroutine function of the workload and a Job) in its own uvloop,
    and ``merge`` joins what they return."""

    def __init__(
        self,
        workload: Any,
        size: int,
        runner: Callable[[Any, Job], Coroutine[Any, Any, R]],
        merge: Callable[[list[R]], R],
    ) -> None:
        ctx = mp.get_context("spawn")  # no inherited event loops or threads
        self._merge = merge
        self._conns: list[Connection] = []
        self._procs = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child, workload, runner), daemon=True)
            p.start()
            self._conns.append(parent)
            self._procs.append(p)
        for c in self._conns:
            if not c.poll(60) or c.recv() != "ready":
                self.close()
                raise RuntimeError("a load generator process did not start")

    @property
    def size(self) -> int:
        return len(self._procs)

    def _split(self, n: int) -> list[int]:
        return [n // self.size + (1 if i < n % self.size else 0) for i in range(self.size)]

    def run_job(
        self,
        mode: str,
        level: float,
        duration_s: float,
        poisson: bool = True,
        seed: int = 0,
        warmup_s: float = 0.0,
        requests: int | None = None,
    ) -> R:
        """Run one job across the workers and merge what each returns.

        Closed loop spreads ``level`` connections over the workers; open loop splits the
        rate; ``requests`` (a count to measure) is split like connections.
        """
        shares: list[float]
        if mode == "closed":
            shares = [float(s) for s in self._split(int(level))]
        else:
            shares = [level / self.size] * self.size
        counts: list[int | None] = list(self._split(requests)) if requests is not None else [None] * self.size
        start_at = time.monotonic() + 0.2  # every worker starts on the same instant
        active = [
            (c, share, n)
            for c, share, n in zip(self._conns, shares, counts, strict=True)
            if share > 0 and n != 0
        ]
        for i, (c, share, n) in enumerate(active):
            c.send(Job(mode, share, start_at, duration_s, poisson, seed * 1000 + i, warmup_s, n))
        return self._merge([c.recv() for c, _, _ in active])

    def close(self) -> None:
        for c in self._conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                c.send(None)
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()


class WorkerPool(ProcessPool[Records]):
    """The tensor-mode pool: each worker sends pre-encoded OIP requests."""

    def __init__(self, workload: Workload, size: int) -> None:
        super().__init__(workload, size, _run, Records.merge)

    def run(self, mode: str, level: float, duration_s: float, poisson: bool = True, seed: int = 0) -> Records:
        """Run one window across the workers and return every request it made."""
        return self.run_job(mode, level, duration_s, poisson, seed)
