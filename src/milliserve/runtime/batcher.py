"""Work-conserving dynamic batcher.

One worker coroutine per model instance. An idle worker takes what is queued at
once; requests that arrive while every instance is busy pile up and leave
together as the next batch (up to ``max_batch_size``). ``max_queue_delay`` adds
waiting only when a batch could grow toward a preferred size: the batch is
short of it, the measured arrival rate says another request is due before the
delay runs out, *and* recent requests arrived while others were still pending.
The last test matters for closed-loop clients: a client that waits for each
answer before sending again arrives at a high rate but never concurrently, and
holding its request back would only delay the next one. A lone request, or a
sequential client, therefore never waits.

Other rules, as in Triton:
- a bounded queue (``max_queue_size``) rejects at once when full; but a request of a flow
  (a client connection, ``QueuedRequest.flow``) holding fewer queued requests than another
  is taken, and that other flow's newest request refused in its place (drop from the longest
  queue, as fq_codel): one client's flood fills the queue with its own requests only;
- a per-request timeout drops a request that expires in the queue (REJECT) or
  lets fresher requests go first (DELAY);
- priority levels: level 1 is served first;
- within a level, flows take turns (round robin over their requests, each flow's in order):
  a lone client's request waits for one request of each other flow, not for all of theirs
  (issue 24, item 5: 4,000 calls queued from 40 connections made a good client wait 300 ms);
- only requests with equal non-batch shapes are merged.

A queued request whose caller is cancelled (a client gone, a hedged copy that lost) leaves
the queue at once and is never run; one already running finishes, and its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter, deque
from collections.abc import Hashable
from typing import Any

import numpy as np

from milliserve.errors import (
    QueueFullError,
    QueueTimeoutError,
    ServerShuttingDownError,
)
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.queued_request import QueuedRequest, Runner, round_robin

__all__ = ["Batcher"]

# Weight of the newest observation in the running estimates.
_GAP_ALPHA = 0.2
# Waiting is allowed only when at least this share of recent arrivals found other requests pending.
_MIN_OVERLAP = 0.5


def _drop_result(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Batcher:
    """Queues validated requests and feeds batches to ``runner(batch, instance_index)``.

    Two paths lead to an instance. When nothing is queued and an instance is free,
    the request's own task runs it at once (no hand-off to another coroutine). Otherwise
    the request queues, and the dispatcher forms the next batch as soon as an instance
    frees up.
    """

    def __init__(self, policy: BatchPolicy, runner: Runner, instances: int) -> None:
        self.policy = policy
        self._runner = runner
        self._free: list[int] = list(range(instances))
        self._queues: list[deque[QueuedRequest]] = [deque() for _ in range(max(1, policy.priority_levels))]
        self._size = 0
        self._inflight = 0
        self._inflight_items = 0
        self._closed = False
        self._overlap = 0.0
        self._gap: float | None = None
        self._last_arrival: float | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        # For models run on the event loop thread, and pipelines' steps: before running an
        # idle instance's batch, yield the loop so requests the server has already read join
        # it (see execute and _gather).
        self.gather_ready = False
        # at most this many turns (``_gather``): one for a microsecond model, whose batch
        # costs about what a turn of the loop does; more where a batch's fixed cost is large
        self.gather_turns = 1
        self._gathering = 0  # requests yielding for companions right now (they count as pending)
        self._in_turn = 0  # requests in a loop turn's batch not yet run (LoopTurn.join)
        self._gather_count = 0
        self.busy_s = 0.0  # instance-seconds spent running batches (budget-driven batching reads it)
        # asyncio objects are made in start(), inside the running loop
        self._wakeup: asyncio.Event
        self._drained: asyncio.Event

    @property
    def queued(self) -> int:
        return self._size

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def free_instances(self) -> int:
        return len(self._free)

    def pending(self) -> int:
        """Requests accepted and not yet answered: queued, in a loop turn's batch, running."""
        return self._size + self._in_turn + self._inflight_items

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name=f"batcher-{self.policy.label}")

    async def execute(self, item: QueuedRequest, timeout_s: float | None) -> dict[str, np.ndarray[Any, Any]]:
        """Run a request and return its outputs (the fast path when an instance is idle)."""
        self._admit(item)
        if not self._size and self._free and self._wait_until([item], item.enqueued) is None:
            index = self._free.pop()
            batch = [item]
            if self.gather_ready and self.policy.merge and self._gather_now():
                self._gathering += 1
                try:
                    await self._gather()
                except asyncio.CancelledError:
                    self._free.append(index)
                    raise
                finally:
                    self._gathering -= 1
                batch = self._join(item)
            taken = self._take(batch, time.perf_counter())
            if len(taken) == 1:
                await self._run(index, taken)
            else:
                # Other callers' requests ride in this batch: it must finish even if this
                # caller is cancelled (a client gone, a hedged copy that lost), or theirs hang.
                run = asyncio.create_task(self._run(index, taken))
                self._running.add(run)
                run.add_done_callback(self._running.discard)
                try:
                    await asyncio.shield(run)
                except asyncio.CancelledError:
                    # nobody waits for this caller's answer now: an error set on it later
                    # (its deadline passed in the batch) is dropped, not logged as unseen
                    item.future.add_done_callback(_drop_result)
                    raise
            return item.future.result()
        self._enqueue(item, timeout_s)
        return await item.future

    async def _gather(self) -> None:
        """Yield the loop while it brings companions, at most ``gather_turns`` turns. The
        first turn lets every request already received run up to this batcher and queue
        here (the instance is taken); a later one lets the loop read the sockets again, so
        that the rest of a burst of clients, whose bytes arrived while the first ran, rides
        in this batch too instead of waiting for the next. A turn that brings nobody ends
        it, as does a full batch."""
        limit = self.policy.max_batch_size
        before = self._size
        for _ in range(self.gather_turns):
            await asyncio.sleep(0)
            now = self._size
            if now == before or now + 1 >= limit:  # + 1: the request gathering, queued apart
                return
            before = now

    def _gather_now(self) -> bool:
        """Whether to yield for companions: when recent arrivals overlapped (concurrent
        clients), and on every 16th request otherwise, to notice concurrency starting. A
        sequential client thus rarely pays the loop iteration."""
        self._gather_count += 1
        return self._overlap >= _MIN_OVERLAP or self._gather_count % 16 == 0

    def _join(self, first: QueuedRequest) -> list[QueuedRequest]:
        """``first`` and the queued requests that may share its batch."""
        batch, total = [first], first.batch_size
        for it in self._ordered():
            if it.future.done() or it.signature != first.signature:
                continue
            if total + it.batch_size > self.policy.max_batch_size:
                break
            batch.append(it)
            total += it.batch_size
        return batch

    def submit(self, item: QueuedRequest, timeout_s: float | None, counted: bool = False) -> None:
        """Queue a request; its future resolves with the outputs. Raises at once when the
        queue is full or the batcher is closing. ``counted``: its arrival is in the estimates
        already (it joined a turn's batch first)."""
        self._admit(item, counted)
        self._enqueue(item, timeout_s)

    def alone_now(self) -> bool:
        """Whether a request arriving now would run at once and alone in ``execute``'s own
        call, without waiting or yielding the loop: nothing queued, an instance free, the
        batcher open, and no reason to wait for companions (concurrent clients; or the one
        request in 16 that looks for them). The express lane (``BatchExecute.run_now``) then
        runs it so in the caller's thread, with ``take_alone`` and ``give_back``."""
        if self._closed or self._size or not self._free or self._gathering:
            return False
        if not self.policy.merge:
            return True
        return self._overlap < _MIN_OVERLAP and not (self.gather_ready and (self._gather_count + 1) % 16 == 0)

    def take_alone(self, now: float) -> int:
        """An idle instance for a request that ``alone_now`` let run at once; its arrival is
        counted as ``execute`` counts one."""
        if self.policy.merge and self.gather_ready:
            self._gather_count += 1  # as ``_gather_now`` counts
        self._arrived(now)
        return self._free.pop()

    def turn_open(self) -> bool:
        """Whether a request may join a turn's batch (``LoopTurn.join``): the
        batcher open and merging, nothing queued, an instance free and nobody gathering, as
        ``alone_now`` asks, whatever the overlap."""
        return self.policy.merge and not (self._closed or self._size or not self._free or self._gathering)

    def arrived_in_turn(self, now: float, companions: bool) -> None:
        """A request joining a turn's batch, counted as ``take_alone`` counts an arrival (one
        that finds ``companions`` in the turn overlapped them), and among the pending ones
        until its turn runs (``left_turn``)."""
        if self.gather_ready:
            self._gather_count += 1  # as ``_gather_now`` counts
        self._arrived(now, companions)
        self._in_turn += 1

    def left_turn(self, requests: int) -> None:
        """A turn's batch of ``requests`` runs now (or queues here): no longer pending apart."""
        self._in_turn -= requests

    def take_turn(self) -> int | None:
        """An idle instance for a turn's batch, if ``turn_open`` still holds; None: it no
        longer does (a request on the road took the instance, or queued, in between)."""
        return self._free.pop() if self.turn_open() else None

    def give_back(self, index: int, started: float) -> None:
        """The end of a ``take_alone`` run that began at ``started``. Nothing else ran in
        between (the run never awaited), so the queue is as it was: empty."""
        self.busy_s += time.perf_counter() - started
        self._free.append(index)

    def _admit(self, item: QueuedRequest, counted: bool = False) -> None:
        if self._closed:
            raise ServerShuttingDownError(f"model {self.policy.label!r} is unloading or shutting down")
        limit = self.policy.max_queue_size
        if limit and self._size >= limit:
            self._make_room(item.flow, limit)
        if not counted:
            self._arrived(item.enqueued)

    def _arrived(self, now: float, companions: bool = False) -> None:
        """A request's arrival, in the estimates of the arrival gap and of overlap."""
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self._gap = gap if self._gap is None else self._gap + _GAP_ALPHA * (gap - self._gap)
        self._last_arrival = now
        concurrent = 1.0 if companions or self._size or self._inflight_items or self._gathering else 0.0
        self._overlap += _GAP_ALPHA * (concurrent - self._overlap)

    def _make_room(self, flow: Hashable, limit: int) -> None:
        """The queue is full: refuse the newest request of the flow holding the most, if it
        holds more than ``flow`` would; otherwise raise QueueFullError for this one."""
        counts: Counter[Hashable] = Counter(it.flow for q in self._queues for it in q if not it.future.done())
        full = QueueFullError(
            f"model {self.policy.label!r} has {self._size} requests queued (max_queue_size "
            f"{limit}); retry later"
        )
        longest, held = counts.most_common(1)[0] if counts else (None, 0)
        if held <= counts[flow] + 1:
            raise full
        for q in reversed(self._queues):
            for it in reversed(q):
                if it.flow == longest and not it.future.done():
                    q.remove(it)
                    self._size -= 1
                    if it.timer is not None:
                        it.timer.cancel()
                    it.future.set_exception(full)
                    return
        raise full  # not reached: ``longest`` holds a request

    def _enqueue(self, item: QueuedRequest, timeout_s: float | None) -> None:
        if timeout_s is not None:
            loop = asyncio.get_running_loop()
            item.timer = loop.call_later(timeout_s, self._on_timeout, item, timeout_s)
        self._queues[item.priority].append(item)
        self._size += 1
        item.future.add_done_callback(functools.partial(self._forget, item))
        self._drained.clear()
        self._wakeup.set()

    def _forget(self, item: QueuedRequest, future: asyncio.Future[Any]) -> None:
        """A queued request whose caller was cancelled leaves the queue now, not when the next
        batch forms: it no longer counts toward ``max_queue_size`` or the queue length."""
        if not future.cancelled() or item.dispatched:
            return
        queue = self._queues[item.priority]
        if item not in queue:  # already taken out (a batch formed and skipped it)
            return
        queue.remove(item)
        self._size -= 1
        if item.timer is not None:
            item.timer.cancel()
        self._note_idle()

    def _on_timeout(self, item: QueuedRequest, timeout_s: float) -> None:
        if item.dispatched or item.future.done():
            return
        if self.policy.delay_on_timeout:
            item.expired = True
            return
        self._queues[item.priority].remove(item)
        self._size -= 1
        item.future.set_exception(
            QueueTimeoutError(
                f"request to model {self.policy.label!r} waited {timeout_s * 1e6:.0f} µs in the "
                "queue and timed out before an instance was free"
            )
        )
        self._note_idle()

    async def _run(self, index: int, batch: list[QueuedRequest]) -> None:
        self._inflight += 1
        self._inflight_items += len(batch)
        self._drained.clear()
        started = time.perf_counter()
        try:
            await self._runner(batch, index)
        finally:
            self.busy_s += time.perf_counter() - started
            self._inflight -= 1
            self._inflight_items -= len(batch)
            self._free.append(index)
            if self._size:
                self._wakeup.set()
            self._note_idle()

    def _note_idle(self) -> None:
        if self._size == 0 and self._inflight == 0:
            self._drained.set()

    async def _dispatch_loop(self) -> None:
        while True:
            batch = await self._next_batch()
            task = asyncio.create_task(self._run(self._free.pop(), batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            # not held while the next batch is awaited: its inputs may be views of a
            # shared-memory region that its client unregisters meanwhile
            del batch, task

    async def _next_batch(self) -> list[QueuedRequest]:
        """Wait for queued work and a free instance; return the batch to run."""
        while True:
            if not self._size or not self._free:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            now = time.perf_counter()
            batch = self._collect()
            if not batch:
                continue
            wait_until = self._wait_until(batch, now)
            if wait_until is None:
                return self._take(batch, now)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), wait_until - now)

    def _ordered(self) -> list[QueuedRequest]:
        """Queued requests in service order: priority, then fresh before expired, then the
        flows in turn (each flow's requests in order)."""
        items: list[QueuedRequest] = []
        late: list[QueuedRequest] = []
        for q in self._queues:
            fresh: list[QueuedRequest] = []
            for it in q:
                (late if it.expired else fresh).append(it)
            items += round_robin(fresh)
        return items + round_robin(late) if late else items

    def _collect(self) -> list[QueuedRequest]:
        batch: list[QueuedRequest] = []
        total = 0
        for it in self._ordered():
            if it.future.done():  # the client went away; drop it when taking
                continue
            if not batch:
                batch.append(it)
                total = it.batch_size
                if not self.policy.merge:
                    break
                continue
            if it.signature != batch[0].signature:
                continue
            if total + it.batch_size > self.policy.max_batch_size:
                break
            batch.append(it)
            total += it.batch_size
        if not batch:  # only cancelled requests were queued: discard them
            for q in self._queues:
                q.clear()
            self._size = 0
            self._note_idle()
        return batch

    def _wait_until(self, batch: list[QueuedRequest], now: float) -> float | None:
        """When to stop waiting for the batch to grow, or None to dispatch now."""
        p = self.policy
        if not p.merge or p.max_queue_delay_s <= 0:
            return None
        total = sum(it.batch_size for it in batch)
        if total >= p.target_batch() or total in p.preferred_batch_sizes:
            return None
        if self._overlap < _MIN_OVERLAP:  # arrivals are sequential: nobody else is coming
            return None
        limit = min(it.enqueued for it in batch) + p.max_queue_delay_s
        if now >= limit or self._gap is None or self._last_arrival is None:
            return None
        if self._last_arrival + self._gap > limit:  # nobody is due in time: don't make them wait
            return None
        return limit

    def _take(self, batch: list[QueuedRequest], now: float) -> list[QueuedRequest]:
        if self._size:  # a lone request on an idle instance was never queued: nothing to take out
            self._take_queued(batch)
        for it in batch:
            it.dispatched = now
            if it.timer is not None:
                it.timer.cancel()
        return batch

    def _take_queued(self, batch: list[QueuedRequest]) -> None:
        chosen = set(map(id, batch))
        for i, q in enumerate(self._queues):
            kept = deque(it for it in q if id(it) not in chosen and not it.future.done())
            self._size -= len(q) - len(kept)
            self._queues[i] = kept

    async def close(self, drain: bool = True) -> None:
        """Stop taking requests; with ``drain``, finish every queued and running one first."""
        self._closed = True
        if drain:
            await self._drained.wait()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, *self._running, return_exceptions=True)
            self._dispatcher = None
        for q in self._queues:
            for it in q:
                if not it.future.done():
                    it.future.set_exception(
                        ServerShuttingDownError(f"model {self.policy.label!r} was unloaded")
                    )
            q.clear()
        self._size = 0
