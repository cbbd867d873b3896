"""The load generator, one for every mode: a level's phases, the closed and the open loop,
and the worker processes that run them.

A level runs in three phases. *Warmup*: requests scheduled in the first ``warmup_s`` are
sent but not measured. *Measured*: those scheduled in the next ``duration_s`` (or the next
``requests`` of them). *Cooldown*: the same load goes on, unmeasured, until the last
measured request has ended, so that every measured request ran under the full load (a
closed loop that stopped sending would let its last requests run alone, and flatter them).
Then the level waits for what is still in flight and ends.

*Closed loop*: N coroutines, each sending its next request as its last one ends; latency
from the send. *Open loop*: requests at scheduled instants (Poisson or evenly spaced)
whatever the server does; latency from each request's *scheduled* instant, so a stall is
charged to every request it delayed (coordinated omission corrected). A clock thread sleeps
to each instant (event-loop timers have millisecond resolution) with the kernel's timer
slack at 1 ns (the default 50 µs made every sleep end 50-90 µs late here), wakes SPIN_S
early and spends the rest yielding the interpreter in a loop (a wake-up still came ~30 µs
late), and sends at once where the mode's client can send from that thread (HTTP);
otherwise it hands the send to the event loop. What lateness remains is recorded per
request and reported (p50 and p99 of every level).

Each mode gives a workload (picklable, sent to the worker processes) whose ``client()``
builds, inside the worker's event loop, the client that sends its requests and records
them (``records.Recorder``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import multiprocessing as mp
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from milliserve.bench.records import CONNECT_ERROR, COOLDOWN, MEASURED, WARMUP, Recorder, Records

__all__ = [
    "Client",
    "Job",
    "LoadWorkload",
    "Phases",
    "ProcessPool",
    "WorkerPool",
    "precise_sleeps",
    "run_job",
]

R = TypeVar("R")
CONNECT_RETRY_S = 0.05  # a closed-loop connection's pause after a refused connect
# the open loop's clock wakes this long before each instant and yields in a loop until it:
# a sleep's wake-up comes ~30 µs late on a 2-vCPU VM even at 1 ns timer slack; the loop
# costs ~1-2% of a core at 1000 req/s and lets the event loop take the interpreter between
# its turns (docs/bench.md, "Which clock is right")
SPIN_S = 50e-6


@dataclass(frozen=True)
class Job:
    mode: str  # "closed" or "open"
    level: float  # this worker's concurrency (closed) or requests per second (open)
    start_at: float  # time.monotonic() instant shared by all workers
    duration_s: float  # the measured phase (after the warmup)
    poisson: bool = True
    seed: int = 0
    warmup_s: float = 0.0
    requests: int | None = None  # measure this many requests instead of duration_s


class Client(Protocol):
    """Sends one mode's requests and records each into the Recorder it was built with,
    telling ``finished(phase)`` as each one ends."""

    @property
    def send_now(self) -> Callable[[int, float, int], None] | None:
        """Send request n at once from the open loop's clock thread, or None: sends must go
        through the event loop."""
        ...

    async def request(self, n: int, intended: float, phase: int) -> int:
        """Send request ``n`` (round-robin over the workload), wait for its end; its status."""
        ...

    async def close(self) -> None:
        """Wait for what is in flight and let go of the connections."""
        ...


class LoadWorkload(Protocol):
    def client(self, rec: Recorder, finished: Callable[[int], None]) -> Client:
        """The client for this workload, built inside the worker's running event loop."""
        ...


class Phases:
    """Which phase a request scheduled at an instant belongs to, and when the level is over.
    ``assign`` may run on the clock thread while ``finished`` runs on the loop: a lock keeps
    the counts, and ``over`` is set on the loop."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.measure_from = job.start_at + job.warmup_s
        self.measure_to = self.measure_from + job.duration_s if job.requests is None else math.inf
        self.quota = job.requests
        self.measured = 0
        self.pending = 0  # measured requests in flight
        self.over = asyncio.Event()
        self.stopped = threading.Event()  # the clock thread's view of ``over``
        self._lock = threading.Lock()
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def assign(self, t: float) -> int:
        with self._lock:
            if t < self.measure_from:
                return WARMUP
            if (self.quota is None and t < self.measure_to) or (
                self.quota is not None and self.measured < self.quota
            ):
                self.measured += 1
                self.pending += 1
                return MEASURED
        self.check()
        return COOLDOWN

    def finished(self, phase: int) -> None:
        if phase == MEASURED:
            with self._lock:
                self.pending -= 1
        self.check()

    def check(self) -> None:
        """Set ``over`` once the measured phase has stopped sending and its requests are done."""
        with self._lock:
            sending_over = (
                time.monotonic() >= self.measure_to if self.quota is None else self.measured >= self.quota
            )
            over = sending_over and self.pending == 0
        if over and not self.stopped.is_set():
            self.stopped.set()
            if threading.get_ident() == self._loop_thread:
                self.over.set()
            else:
                self._loop.call_soon_threadsafe(self.over.set)

    def check_at_the_end(self) -> None:
        # a timed level with nothing measured in flight is over when its window closes, not
        # when the next request (perhaps many seconds away at a low rate) comes to look
        if math.isfinite(self.measure_to):
            self._loop.call_later(max(0.0, self.measure_to - time.monotonic()), self.check)


def precise_sleeps() -> None:
    """Let this thread's sleeps end on time: Linux delays a sleeping thread's wake-up by up
    to its timer slack (50 µs by default) to batch wake-ups; a load generator's clock wants
    1 ns. Nothing elsewhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK


def wait_until(t: float, stopped: threading.Event) -> bool:
    """Sleep on the calling thread until ``t`` (time.monotonic()), the last SPIN_S in a loop
    that yields the interpreter; True when ``stopped`` was set meanwhile (long waits are
    cut short by it)."""
    while (delay := t - SPIN_S - time.monotonic()) > 0.01:
        if stopped.wait(delay - 0.005):
            return True
    if delay > 0:
        time.sleep(delay)
    while time.monotonic() < t:
        time.sleep(0)  # releases the interpreter: the event loop may read an answer meanwhile
    return stopped.is_set()


def arrivals(job: Job) -> Iterator[float]:
    """The scheduled instants of an open loop: Poisson or evenly spaced at ``job.level``/s."""
    rng = np.random.default_rng(job.seed)
    t = job.start_at
    while True:
        gaps = rng.exponential(1 / job.level, 256) if job.poisson else np.full(256, 1 / job.level)
        for g in gaps:
            yield t
            t += float(g)


async def _closed(client: Client, job: Job, phases: Phases, counter: Iterator[int]) -> None:
    async def loop() -> None:
        while not phases.over.is_set():
            now = time.monotonic()
            if await client.request(next(counter), now, phases.assign(now)) == CONNECT_ERROR:
                # refused at once: count it, but do not spin through thousands a second
                await asyncio.sleep(CONNECT_RETRY_S)

    await asyncio.sleep(max(0.0, job.start_at - time.monotonic()))
    phases.check_at_the_end()
    await asyncio.gather(*(loop() for _ in range(int(job.level))))


async def _open(client: Client, job: Job, phases: Phases, counter: Iterator[int]) -> None:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[int]] = set()
    direct = client.send_now

    def fire(t: float, n: int, phase: int) -> None:
        task = loop.create_task(client.request(n, t, phase))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def schedule() -> None:
        precise_sleeps()
        for t in arrivals(job):
            if wait_until(t, phases.stopped):
                return
            n, phase = next(counter), phases.assign(t)
            if direct is not None:
                direct(n, t, phase)
            else:
                loop.call_soon_threadsafe(fire, t, n, phase)

    clock = threading.Thread(target=schedule, name="bench-clock", daemon=True)
    clock.start()
    phases.check_at_the_end()
    try:
        await phases.over.wait()
    finally:
        phases.stopped.set()
        await asyncio.to_thread(clock.join)
    while tasks:
        await asyncio.gather(*tasks)


async def run_job(workload: LoadWorkload, job: Job) -> Records:
    """One worker's share of a level (the ``ProcessPool`` runner): every request it made."""
    rec = Recorder()
    loop = asyncio.get_running_loop()
    phases = Phases(job, loop)
    client = workload.client(rec, phases.finished)
    counter = iter(range(job.seed, 1 << 62))
    cpu0 = time.process_time()
    try:
        await (_closed if job.mode == "closed" else _open)(client, job, phases, counter)
    finally:
        await client.close()
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
    """The load generator's processes for one workload (any mode)."""

    def __init__(self, workload: LoadWorkload, size: int) -> None:
        super().__init__(workload, size, run_job, Records.merge)
