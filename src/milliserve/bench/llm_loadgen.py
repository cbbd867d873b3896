"""The LLM mode's load: streamed completions in a closed or an open loop, in phases.

A level runs in three phases. *Warmup*: requests scheduled in the first
``warmup_s`` are sent but not measured. *Measured*: those scheduled in the next
``duration_s`` (or the next ``requests`` of them). *Cooldown*: the same load goes on,
unmeasured, until the last measured request has finished, so that every measured
request ran under the full load (a closed loop that stopped sending would let its
last requests run alone, and flatter them). Then the level waits for what is still
in flight and ends.

Runs inside a worker process (``ProcessPool``); each request comes back with its
scheduled instant, the instants of its content chunks and its status.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.bench.llm_client import LlmClient, StreamResult
from milliserve.bench.llm_workload import LlmWorkload
from milliserve.bench.loadgen import CONNECT_ERROR, Job

__all__ = ["COOLDOWN", "MEASURED", "WARMUP", "LlmRecords", "run_llm_job"]

WARMUP, MEASURED, COOLDOWN = 0, 1, 2
CONNECT_RETRY_S = 0.05  # a closed-loop connection's pause after a refused connect


@dataclass
class LlmRecords:
    """Every request of one run; chunk arrays are flat, request i owning
    ``chunk_t[offsets[i]:offsets[i + 1]]``."""

    intended: np.ndarray[Any, Any]
    sent: np.ndarray[Any, Any]
    done: np.ndarray[Any, Any]
    status: np.ndarray[Any, Any]
    phase: np.ndarray[Any, Any]
    output_tokens: np.ndarray[Any, Any]
    usage_known: np.ndarray[Any, Any]  # the server reported completion_tokens
    offsets: np.ndarray[Any, Any]  # len(requests) + 1
    chunk_t: np.ndarray[Any, Any]
    chunk_tokens: np.ndarray[Any, Any]  # each chunk's share of the output tokens
    chunk_known: np.ndarray[Any, Any]  # per request: chunk_tokens came from the server per chunk
    timings: list[dict[str, float]] = field(default_factory=list)
    messages: dict[int, str] = field(default_factory=dict)  # first error message per status
    cpu_s: float = 0.0

    def __len__(self) -> int:
        return int(self.intended.size)

    @staticmethod
    def merge(parts: list[LlmRecords]) -> LlmRecords:
        messages: dict[int, str] = {}
        for p in parts:
            for k, v in p.messages.items():
                messages.setdefault(k, v)
        shift = np.cumsum([0] + [p.chunk_t.size for p in parts[:-1]])
        offsets = np.concatenate(
            [np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, shift, strict=True)]
        )

        def cat(name: str) -> np.ndarray[Any, Any]:
            return np.concatenate([getattr(p, name) for p in parts])

        return LlmRecords(
            intended=cat("intended"),
            sent=cat("sent"),
            done=cat("done"),
            status=cat("status"),
            phase=cat("phase"),
            output_tokens=cat("output_tokens"),
            usage_known=cat("usage_known"),
            offsets=offsets,
            chunk_t=cat("chunk_t"),
            chunk_tokens=cat("chunk_tokens"),
            chunk_known=cat("chunk_known"),
            timings=[t for p in parts for t in p.timings],
            messages=messages,
            cpu_s=sum(p.cpu_s for p in parts),
        )


class _Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, int, int, int, bool, bool]] = []
        self.chunk_t: list[float] = []
        self.chunk_tokens: list[float] = []
        self.offsets = [0]
        self.timings: list[dict[str, float]] = []
        self.messages: dict[int, str] = {}

    def add(self, intended: float, phase: int, r: StreamResult) -> None:
        t = r.tally
        shares = t.per_chunk_tokens()
        self.rows.append(
            (
                intended,
                r.sent,
                r.done,
                r.status,
                phase,
                t.output_tokens,
                t.completion_tokens is not None,
                bool(shares) and len(t.chunk_tokens) == len(shares),
            )
        )
        self.chunk_t += t.chunk_times
        self.chunk_tokens += shares
        self.offsets.append(len(self.chunk_t))
        self.timings.append(t.timings)
        if r.message and r.status not in self.messages:
            self.messages[r.status] = r.message[:300]

    def records(self, cpu_s: float) -> LlmRecords:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 8
        return LlmRecords(
            np.asarray(cols[0], np.float64),
            np.asarray(cols[1], np.float64),
            np.asarray(cols[2], np.float64),
            np.asarray(cols[3], np.int32),
            np.asarray(cols[4], np.int8),
            np.asarray(cols[5], np.int64),
            np.asarray(cols[6], bool),
            np.asarray(self.offsets, np.int64),
            np.asarray(self.chunk_t, np.float64),
            np.asarray(self.chunk_tokens, np.float64),
            np.asarray(cols[7], bool),
            self.timings,
            self.messages,
            cpu_s,
        )


class _Phases:
    """Which phase a request scheduled at an instant belongs to, and when the level is over."""

    def __init__(self, job: Job) -> None:
        self.measure_from = job.start_at + job.warmup_s
        self.measure_to = self.measure_from + job.duration_s if job.requests is None else math.inf
        self.quota = job.requests
        self.measured = 0
        self.pending = 0  # measured requests in flight
        self.over = asyncio.Event()

    def assign(self, t: float) -> int:
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
            self.pending -= 1
        self.check()

    def check(self) -> None:
        """Set ``over`` once the measured phase has stopped sending and its requests are done."""
        sending_over = (
            time.monotonic() >= self.measure_to if self.quota is None else self.measured >= self.quota
        )
        if sending_over and self.pending == 0:
            self.over.set()


async def _one(
    client: LlmClient, w: LlmWorkload, n: int, intended: float, phases: _Phases, rec: _Recorder
) -> int:
    phase = phases.assign(intended)
    try:
        r = await client.request(w.requests[n % len(w.requests)])
    finally:
        phases.finished(phase)
    rec.add(intended, phase, r)
    return r.status


async def _closed(client: LlmClient, w: LlmWorkload, job: Job, phases: _Phases, rec: _Recorder) -> None:
    counter = iter(range(job.seed, 1 << 62))

    async def loop() -> None:
        while not phases.over.is_set():
            if await _one(client, w, next(counter), time.monotonic(), phases, rec) == CONNECT_ERROR:
                # refused at once: count it, but do not spin through thousands a second
                await asyncio.sleep(CONNECT_RETRY_S)

    await asyncio.sleep(max(0.0, job.start_at - time.monotonic()))
    _check_at_the_end(phases)
    await asyncio.gather(*(loop() for _ in range(int(job.level))))


def _check_at_the_end(phases: _Phases) -> None:
    # a timed level with nothing measured in flight is over when its window closes, not
    # when the next request (perhaps many seconds away at a low rate) comes to look
    if math.isfinite(phases.measure_to):
        asyncio.get_running_loop().call_later(max(0.0, phases.measure_to - time.monotonic()), phases.check)


def _arrivals(job: Job) -> Iterator[float]:
    rng = np.random.default_rng(job.seed)
    t = job.start_at
    while True:
        gaps = rng.exponential(1 / job.level, 256) if job.poisson else np.full(256, 1 / job.level)
        for g in gaps:
            yield t
            t += float(g)


async def _open(client: LlmClient, w: LlmWorkload, job: Job, phases: _Phases, rec: _Recorder) -> None:
    """Send at scheduled instants (Poisson or evenly spaced) until the level is over; a
    thread waits for each instant, as in the tensor mode, and hands the send to the loop."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[int]] = set()
    stop = threading.Event()
    counter = iter(range(job.seed, 1 << 62))

    def fire(t: float) -> None:
        if phases.over.is_set():
            return
        task = loop.create_task(_one(client, w, next(counter), t, phases, rec))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def schedule() -> None:
        for t in _arrivals(job):
            if stop.wait(max(0.0, t - time.monotonic())):
                return
            loop.call_soon_threadsafe(fire, t)

    clock = threading.Thread(target=schedule, name="bench-llm-schedule", daemon=True)
    clock.start()
    _check_at_the_end(phases)
    try:
        await phases.over.wait()
    finally:
        stop.set()
        await asyncio.to_thread(clock.join)
    while tasks:
        await asyncio.gather(*tasks)


async def run_llm_job(w: LlmWorkload, job: Job) -> LlmRecords:
    """One worker's share of a level (``ProcessPool`` runner)."""
    rec = _Recorder()
    client = LlmClient(w)
    phases = _Phases(job)
    cpu0 = time.process_time()
    try:
        await (_closed if job.mode == "closed" else _open)(client, w, job, phases, rec)
    finally:
        client.close()
    return rec.records(time.process_time() - cpu0)
