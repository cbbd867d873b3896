"""The sequence batcher's scheduling: which sequence runs where, and when.

Each sequence (a correlation id) is placed on one model instance for its whole life, and
its requests run there in arrival order, one at a time: the next waits until the previous
is answered, so the state it produced (the model's, or the implicit state the server
keeps) is there for it. Sequences batch with each other: an instance runs, in one batch,
the next request of every sequence placed on it that has one waiting.

Two strategies, as Triton's:

- ``direct``: a sequence holds a batch slot of its instance (``max_batch_size`` slots, one
  when the model does not batch) and always rides in that row; a batch spans the rows up to
  the highest slot with a request, and rows without one are sent with READY false.
- ``oldest``: an instance takes up to ``max_candidate_sequences`` sequences and batches the
  oldest waiting requests of distinct sequences (at most ``max_batch_size``), in any row.

A sequence with no instance room waits in a backlog until one ends. A sequence idle for
``max_sequence_idle_microseconds`` is released (its slot and state freed); a later
request for it must start it again. What runs a batch is the caller's (``Runner``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError, ServerShuttingDownError

__all__ = ["Row", "Runner", "SeqRequest", "Sequence", "SequenceScheduler"]

log = logging.getLogger(__name__)

CorrelationId = int | str


@dataclass(slots=True, eq=False)
class SeqRequest:
    """One request of a sequence, validated, waiting for its turn."""

    inputs: dict[str, np.ndarray[Any, Any]]
    signature: Any
    start: bool
    end: bool
    future: asyncio.Future[dict[str, np.ndarray[Any, Any]]]
    enqueued: float = field(default_factory=time.perf_counter)
    dispatched: float = 0.0


@dataclass(slots=True, eq=False)
class Sequence:
    """A live sequence: where it runs, what waits, and its implicit state."""

    corr: CorrelationId
    instance: int = -1  # -1: in the backlog
    slot: int = -1  # direct: its row in every batch
    queue: deque[SeqRequest] = field(default_factory=deque)
    busy: bool = False  # a request of it is running
    ended: bool = False  # its last request (sequence_end) is queued or ran
    state: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)


@dataclass(slots=True, eq=False)
class Row:
    """A request in a batch: its sequence, and the row it takes (``slot`` for direct)."""

    seq: Sequence
    request: SeqRequest
    row: int


# runs one batch on an instance: (instance index, rows, number of rows) -> None; it sets
# every row's future (result or exception) and the sequences' state
Runner = Callable[[int, list[Row], int], Awaitable[None]]


class SequenceScheduler:
    """Places sequences on instances and feeds each instance its batches."""

    def __init__(
        self,
        label: str,
        strategy: str,
        instances: int,
        max_batch_size: int,
        idle_s: float,
        runner: Runner,
        max_candidates: int = 0,
        delay_s: float = 0.0,
        target_batch: int = 1,
        key: Callable[[Sequence, SeqRequest], Any] | None = None,
    ) -> None:
        """``key``: requests batch together only when their keys are equal (default: their
        signatures, i.e. the shapes of their inputs)."""
        self.label = label
        self.direct = strategy == "direct"
        self.rows = max(1, max_batch_size)  # rows a batch may have
        # sequences one instance holds at once: its slots (direct), or its candidates (oldest)
        self.capacity = self.rows if self.direct or not max_candidates else max_candidates
        self.idle_s = idle_s
        self.delay_s = delay_s
        self.target = max(1, min(target_batch, self.rows))
        self._runner = runner
        self._key = key or (lambda seq, req: req.signature)
        self.sequences: dict[CorrelationId, Sequence] = {}
        self.backlog: deque[Sequence] = deque()
        self.placed: list[list[Sequence]] = [[] for _ in range(instances)]
        self._free_slots: list[list[int]] = [list(range(self.rows)) for _ in range(instances)]
        self.waiting = 0  # requests queued, not yet running
        self.running = 0  # requests in a batch now
        self.batches = 0
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: list[asyncio.Event] = []
        self._idle: asyncio.Event

    async def start(self) -> None:
        self._wake = [asyncio.Event() for _ in self.placed]
        self._idle = asyncio.Event()
        self._idle.set()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._instance_loop(i), name=f"sequences-{self.label}-{i}")
            for i in range(len(self.placed))
        ]
        self._tasks.append(loop.create_task(self._reap_loop(), name=f"sequence-reaper-{self.label}"))

    # ---- requests ----
    def submit(self, corr: CorrelationId, item: SeqRequest) -> None:
        """Queue ``item`` behind the earlier requests of sequence ``corr``. Raises
        InvalidInputError for a sequence that is not live and a request that does not start
        it, ServerShuttingDownError when closing."""
        if self._closed:
            raise ServerShuttingDownError(f"model {self.label!r} is unloading or shutting down")
        seq = self.sequences.get(corr)
        if not item.start and (seq is None or seq.ended):
            why = (
                "its last request (sequence_end) has already been sent"
                if seq is not None
                else "it was never started, has ended, or was idle longer than "
                f"max_sequence_idle_microseconds ({self.idle_s * 1e6:.0f})"
            )
            raise InvalidInputError(
                f"inference request for sequence {corr!r} to model {self.label!r} must specify the "
                f"START flag on the first request of the sequence: sequence {corr!r} is not active "
                f"({why})"
            )
        if seq is None:
            seq = self.sequences[corr] = Sequence(corr)
            self._place(seq)
        seq.ended = item.end
        seq.queue.append(item)
        seq.last = time.monotonic()
        self.waiting += 1
        self._idle.clear()
        if seq.instance >= 0:
            self._wake[seq.instance].set()

    def _place(self, seq: Sequence) -> None:
        """Give ``seq`` an instance (and a slot) with room, or put it in the backlog."""
        best = -1
        for i, held in enumerate(self.placed):
            if len(held) < self.capacity and (best < 0 or len(held) < len(self.placed[best])):
                best = i
        if best < 0:
            self.backlog.append(seq)
            return
        seq.instance = best
        if self.direct:
            free = self._free_slots[best]
            free.sort()
            seq.slot = free.pop(0)
        self.placed[best].append(seq)

    def _release(self, seq: Sequence) -> None:
        """``seq`` is over (ended or idle): free its place and give it to the backlog."""
        if self.sequences.get(seq.corr) is seq:
            del self.sequences[seq.corr]
        if seq.instance < 0:
            return
        self.placed[seq.instance].remove(seq)
        if seq.slot >= 0:
            self._free_slots[seq.instance].append(seq.slot)
        instance, seq.instance, seq.slot = seq.instance, -1, -1
        if self.backlog:
            nxt = self.backlog.popleft()
            self._place(nxt)
            self._wake[instance].set()
            if nxt.instance >= 0 and nxt.instance != instance:
                self._wake[nxt.instance].set()

    # ---- batches ----
    def _ready(self, instance: int) -> list[Sequence]:
        return [s for s in self.placed[instance] if s.queue and not s.busy]

    def _batch(self, instance: int) -> list[Row]:
        """The next batch of ``instance``: the waiting requests of its sequences that share
        the oldest one's shapes, each in its row."""
        ready = self._ready(instance)
        if not ready:
            return []
        ready.sort(key=lambda s: s.queue[0].enqueued)
        key = self._key
        first = key(ready[0], ready[0].queue[0])
        chosen = [s for s in ready if key(s, s.queue[0]) == first][: self.rows]
        if self.direct:
            return [Row(s, s.queue[0], s.slot) for s in chosen]
        return [Row(s, s.queue[0], i) for i, s in enumerate(chosen)]

    async def _instance_loop(self, instance: int) -> None:
        wake = self._wake[instance]
        while True:
            rows = self._batch(instance)
            if not rows:
                wake.clear()
                await wake.wait()
                continue
            if self.delay_s > 0 and len(rows) < self.target:
                rows = await self._grow(instance, rows)
            now = time.perf_counter()
            for r in rows:
                r.seq.busy = True
                r.seq.queue.popleft()
                r.request.dispatched = now
            self.waiting -= len(rows)
            self.running += len(rows)
            self.batches += 1
            width = max(r.row for r in rows) + 1 if self.direct else len(rows)
            try:
                await self._runner(instance, rows, width)
            except Exception as exc:  # the runner answers its rows; this is a bug
                log.exception("%s: unexpected error running a sequence batch", self.label)
                for r in rows:
                    if not r.request.future.done():
                        r.request.future.set_exception(exc)
            finally:
                self.running -= len(rows)
                self._after(rows)

    async def _grow(self, instance: int, rows: list[Row]) -> list[Row]:
        """Wait (at most the queue delay after the oldest request) for more of this
        instance's sequences to send, while some that could are idle."""
        wake = self._wake[instance]
        limit = min(r.request.enqueued for r in rows) + self.delay_s
        while len(rows) < self.target:
            idle = [s for s in self.placed[instance] if not s.busy and not s.queue]
            left = limit - time.perf_counter()
            if not idle or left <= 0:
                break
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), left)
            except TimeoutError:
                break
            rows = self._batch(instance) or rows
        return self._batch(instance) or rows

    def _after(self, rows: list[Row]) -> None:
        now = time.monotonic()
        for r in rows:
            seq = r.seq
            seq.busy = False
            seq.last = now
            if r.request.end and not seq.queue:
                self._release(seq)
            elif seq.queue and seq.instance >= 0:
                self._wake[seq.instance].set()
        if not self.waiting and not self.running:
            self._idle.set()

    # ---- idle sequences ----
    async def _reap_loop(self) -> None:
        period = min(max(self.idle_s / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(period)
            self.reap(time.monotonic())

    def reap(self, now: float) -> list[CorrelationId]:
        """Release the sequences idle longer than the timeout; returns their ids."""
        gone = [
            s for s in self.sequences.values() if not s.busy and not s.queue and now - s.last > self.idle_s
        ]
        for seq in gone:
            log.debug("%s: sequence %r idle for %.3fs: released", self.label, seq.corr, now - seq.last)
            self._release(seq)
        return [s.corr for s in gone]

    # ---- figures and shutdown ----
    def pending(self) -> int:
        return self.waiting + self.running

    def slots_free(self) -> int:
        return sum(self.capacity - len(p) for p in self.placed)

    async def close(self) -> None:
        """Stop taking requests, finish every queued one, then stop."""
        self._closed = True
        if self._tasks:
            await self._idle.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for seq in list(self.sequences.values()):
            while seq.queue:
                item = seq.queue.popleft()
                if not item.future.done():
                    item.future.set_exception(ServerShuttingDownError(f"model {self.label!r} was unloaded"))
        self.sequences.clear()
        self.backlog.clear()

    @staticmethod
    def target_of(delay_s: float, preferred: tuple[int, ...], max_batch_size: int, utilization: float) -> int:
        """The batch size worth waiting for: the largest preferred size (oldest), or the
        slots ``minimum_slot_utilization`` asks for (direct)."""
        if delay_s <= 0:
            return 1
        if preferred:
            return max(preferred)
        if utilization > 0:
            return max(1, math.ceil(utilization * max(1, max_batch_size)))
        return max(1, max_batch_size)
