"""The terminal of a model's road: queue the request in the batcher, run batches on the
model's instances, split the outputs back to their requests.

Where a batch runs is chosen per batch:

- **inline**, on the event loop thread, when the model is a microsecond one: its
  compute, estimated from the load-time probe and every inline run since, is under
  ``inline_below_s`` (100 µs, the bound under which a single-threaded model's worker
  is placed on the event loop's CPU anyway). Such a worker shares the loop's CPU, so
  handing it the batch buys no parallelism and costs two thread wake-ups (~45-70 µs
  here, more than the model's run); inline, the loop blocks for no longer than the
  worker would have held its CPU. A larger batch or a slower model goes to the worker;
- otherwise on the instance's **worker thread** (``runtime/executor.py``).

Config ``parameters { inline_execution }``: ``auto`` (default), ``true`` (always) or
``false`` (never).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.backends.base import Backend
from milliserve.errors import BackendError, DeadlineUnmeetableError, InvalidInputError
from milliserve.protocol.types import InferRequest, InferTensor
from milliserve.road import Call, Outputs
from milliserve.runtime.adaptive import AdaptiveBatching
from milliserve.runtime.batcher import Batcher, BatchPolicy, QueuedRequest, Runner
from milliserve.runtime.deadline import LatencyEstimator
from milliserve.runtime.executor import InstanceWorker
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import ModelIO, Signature

__all__ = ["BatchExecute", "TurnDone", "TurnItem"]

log = logging.getLogger(__name__)
Arrays = dict[str, np.ndarray[Any, Any]]

_INLINE_MODES = ("auto", "true", "false")


# what a turn's request gets: its outputs (or the exception in their place), and when its batch started
TurnDone = Callable[["Arrays | BaseException", float], None]


@dataclass(slots=True)
class TurnItem:
    """A request in a loop turn's batch (``BatchExecute.join_turn``)."""

    inputs: Arrays
    batch_size: int
    signature: Signature
    work: int  # input elements
    done: TurnDone
    deadline: float | None = None  # perf_counter() by which the answer must be out
    flow: Hashable = None  # the client connection, for the batcher's fairness if it queues
    arrived: float = 0.0


def _answer(item: TurnItem, value: Arrays | BaseException, started: float, label: str) -> None:
    try:
        item.done(value, started)
    except Exception:  # a bug in one request's answer: the others are answered
        log.exception("%s: unexpected error answering a request of a turn's batch", label)


def _settle_from_road(
    queued: QueuedRequest, item: TurnItem, label: str, future: asyncio.Future[Arrays]
) -> None:
    started = queued.dispatched or time.perf_counter()
    if future.cancelled():
        _answer(item, asyncio.CancelledError(), started, label)
        return
    exc = future.exception()
    _answer(item, exc if exc is not None else future.result(), started, label)


class BatchExecute:
    def __init__(
        self,
        label: str,
        policy: BatchPolicy,
        backends: Sequence[Backend],
        io: ModelIO,
        stats: ModelStats,
        estimator: LatencyEstimator,
        inline: str = "auto",
        target_p99_s: float | None = None,
        inline_below_s: float = 100e-6,
        around_batch: Sequence[Callable[[Runner], Runner]] = (),
    ) -> None:
        """``around_batch`` wrap the running of each batch, innermost first (e.g. the
        test-only stall injector, runtime/stall.py)."""
        if inline not in _INLINE_MODES:
            raise ValueError(f"parameter 'inline_execution' must be one of {_INLINE_MODES}, got {inline!r}")
        self.label = label
        self.policy = policy
        self.io = io
        self.stats = stats
        self.estimator = estimator
        self._backends = list(backends)
        self._outputs = list(io.outputs)
        runner: Runner = self._run_batch
        for wrap in around_batch:
            runner = wrap(runner)
        self._wrapped = bool(around_batch)
        self.batcher = Batcher(policy, runner, len(self._backends))
        self.workers: list[InstanceWorker] = []
        self._inline_mode = inline
        # a batch whose estimated compute is under this runs on the event loop thread
        self.inline_below_s = inline_below_s
        # seconds per input element of an inline-eligible model (None: not eligible)
        self._inline_per_work: float | None = None
        self.inline_runs = 0
        self.probe_feeds: Arrays | None = None  # the warmup input, to re-measure the model
        # the requests of this loop turn that run as one batch at its end (join_turn)
        self._turn: list[TurnItem] = []
        self._turn_work = 0
        self._turn_items = 0
        self._turn_signature: Signature | None = None
        self._turn_scheduled = False
        # seconds per input element of a turn's batch, learnt from the turns run (a batch
        # costs less per element than a request alone: the model's fixed cost is shared)
        self._turn_per_work: float | None = None
        self._probes: set[asyncio.Task[None]] = set()
        self.adaptive = (
            AdaptiveBatching(self.batcher, policy, target_p99_s, instances=len(self._backends))
            if target_p99_s
            else None
        )
        stats.pending = self.batcher.pending
        stats.queued = lambda: self.batcher.queued
        if self.adaptive is not None:
            tuned = self.adaptive
            stats.batching = lambda: (
                tuned.batcher.policy.max_batch_size,
                tuned.batcher.policy.max_queue_delay_s,
            )

    async def start(
        self, workers: list[InstanceWorker], compute_s: float | None, work: int, threads: int
    ) -> None:
        """Begin serving with ``workers`` (one per instance); ``compute_s`` is the load-time
        probe of one warmup request of ``work`` elements (None when unknown)."""
        self.workers = workers
        if (
            compute_s is not None
            and compute_s < self.inline_below_s
            and threads == 1
            and self._inline_mode == "auto"
        ):
            self._inline_per_work = self._turn_per_work = compute_s / max(work, 1)
        self.batcher.gather_ready = self.inline
        await self.batcher.start()

    @property
    def inline(self) -> bool:
        """Whether small batches may run on the event loop thread."""
        return self._inline_mode == "true" or self._inline_per_work is not None

    def reprobe(self) -> None:
        """Run the warmup input once in the background, through the batcher like a request,
        so that the latency estimate gets a fresh observation."""
        feeds = self.probe_feeds
        if feeds is None:
            return
        task = asyncio.get_running_loop().create_task(self._probe(feeds))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, feeds: Arrays) -> None:
        batching = self.io.max_batch_size > 0
        size = next(iter(feeds.values())).shape[0] if batching and feeds else 1
        signature = tuple(sorted((n, a.shape[1:]) for n, a in feeds.items()))
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        try:
            await self.batcher.execute(QueuedRequest(feeds, size, signature, future), None)
        except Exception as exc:  # a probe that fails tells nothing; the requests will
            log.debug("%s: latency probe failed: %r", self.label, exc)

    async def close(self) -> None:
        for task in self._probes:
            task.cancel()
        if self._turn:  # a turn's batch still to run: its requests were accepted, as queued ones were
            self._flush_turn()
        await self.batcher.close(drain=True)
        for w in self.workers:
            w.close()
        for b in self._backends:
            b.close()

    # ---- the request ----
    async def __call__(self, call: Call) -> Outputs:
        """Queue the request and return the outputs it asked for. Records the ``queue`` stage
        (until an instance took it) and ``infer`` (from then until the result is back on the
        event loop, hand-offs included)."""
        request = call.request
        params = request.parameters
        policy = self.policy
        priority = policy.priority_index(params.get("priority")) if params else 0
        timeout_s = policy.timeout_s(params.get("timeout") if params else None)
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        item = QueuedRequest(
            {t.name: t.data for t in request.inputs}, call.batch_size, call.signature, future, priority
        )
        item.deadline = call.deadline
        item.flow = request.client
        outputs = await self.batcher.execute(item, timeout_s)
        stages = call.stages
        stages["queue"] = queue = item.dispatched - item.enqueued
        stages["infer"] = infer = time.perf_counter() - item.dispatched
        if self.adaptive is not None:
            self.adaptive.observe(queue, infer)
        return self.tensors(request, outputs)

    def tensors(self, request: InferRequest, outputs: Arrays) -> Outputs:
        """The outputs ``request`` asked for (all, when it named none), as tensors."""
        specs = self.io.outputs
        wanted = [o.name for o in request.outputs] if request.outputs else self._outputs
        return [InferTensor(n, specs[n].datatype, outputs[n].shape, outputs[n]) for n in wanted]

    # ---- batches ----
    def _execute(
        self, backend: Backend, batch: Sequence[QueuedRequest] | Sequence[TurnItem]
    ) -> tuple[list[Arrays], int, int, int]:
        """Assemble, run, split (on a worker thread or inline; a queue's batch or a loop
        turn's). Returns per-request outputs and the nanoseconds of each phase."""
        t0 = time.perf_counter_ns()
        if len(batch) == 1:
            feeds = batch[0].inputs
        else:
            feeds = {n: np.concatenate([it.inputs[n] for it in batch]) for n in batch[0].inputs}
        t1 = time.perf_counter_ns()
        outputs = backend.run(feeds, self._outputs)
        t2 = time.perf_counter_ns()
        if len(batch) == 1:
            per_item = [outputs]
        else:
            per_item = []
            start = 0
            for it in batch:
                end = start + it.batch_size
                per_item.append({n: a[start:end] for n, a in outputs.items()})
                start = end
        t3 = time.perf_counter_ns()
        return per_item, t1 - t0, t2 - t1, t3 - t2

    def _drop_late(self, batch: list[QueuedRequest], now: float) -> list[QueuedRequest]:
        """Answer the requests whose deadline passed while queued, without computing them."""
        late = [it for it in batch if it.deadline is not None and it.deadline <= now]
        if not late:
            return batch
        for it in late:
            if not it.future.done():
                it.future.set_exception(
                    DeadlineUnmeetableError(
                        f"request to model {self.label!r} reached its deadline while queued; not run"
                    )
                )
        return [it for it in batch if not (it.deadline is not None and it.deadline <= now)]

    async def _run_batch(self, batch: list[QueuedRequest], index: int) -> None:
        started = time.perf_counter()
        if self.estimator.active:
            batch = self._drop_late(batch, started)
            if not batch:
                return
        work = sum(a.size for it in batch for a in it.inputs.values())
        per_work = self._inline_per_work
        inline = self._inline_mode == "true" or (
            per_work is not None and per_work * work < self.inline_below_s
        )
        try:
            if inline:
                per_item, in_ns, infer_ns, out_ns = self._execute(self._backends[index], batch)
            else:
                per_item, in_ns, infer_ns, out_ns = await self.workers[index].run(
                    self._execute, self._backends[index], batch
                )
        except (BackendError, InvalidInputError) as exc:
            if len(batch) > 1:
                # Isolation: one request's data may break a batch (e.g. an out-of-range token id);
                # rerun them one by one so only the culprit fails.
                for it in batch:
                    await self._run_batch([it], index)
                return
            if isinstance(exc, BackendError):  # client data errors are the client's to see, not logs'
                log.warning("%s: %s", self.label, exc)
            if not batch[0].future.done():
                batch[0].future.set_exception(exc)
            return
        except Exception as exc:  # a bug, not a model failure: still answer every request
            log.exception("%s: unexpected error running a batch", self.label)
            err = BackendError(f"internal error running model {self.label!r}: {exc}")
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(err)
            return
        items = sum(it.batch_size for it in batch)
        queue_ns = [int((it.dispatched - it.enqueued) * 1e9) for it in batch]
        self._account(started, work, items, queue_ns, inline, in_ns, infer_ns, out_ns)
        for it, outs in zip(batch, per_item, strict=True):
            if not it.future.done():
                it.future.set_result(outs)

    def _account(
        self,
        started: float,
        work: int,
        items: int,
        queue_ns: list[int],
        inline: bool,
        in_ns: int,
        infer_ns: int,
        out_ns: int,
    ) -> None:
        """A batch run, in the estimates (``_learn``) and the statistics."""
        self._learn(started, work, items, inline, infer_ns)
        self.stats.record_batch(items, queue_ns, in_ns, infer_ns, out_ns)

    def _learn(self, started: float, work: int, items: int, inline: bool, infer_ns: int) -> None:
        """A batch run, in the inline estimate and the latency estimate."""
        elapsed = time.perf_counter() - started
        per_work = self._inline_per_work
        if per_work is not None:
            # Keep the inline estimate honest, from the runs on the worker too: once the
            # estimate is over the bound no batch runs inline, and an estimate fed by inline
            # runs only would stay there for good. A run that was preempted (a busy machine)
            # counts at most twice the estimate, so that a spike moves it by 10%, not 10x.
            seen = min(infer_ns / 1e9 / max(work, 1), 2 * per_work)
            self._inline_per_work = per_work + 0.1 * (seen - per_work)
            self.inline_runs += inline
        if self.estimator.active:
            self.estimator.observe(work, elapsed, items, started + elapsed)

    def runs_now(self, work: int) -> bool:
        """Whether a request of ``work`` input elements arriving now would run at once, alone
        and inline: a batch this small runs on the event loop's thread, and the batcher would
        hand it an idle instance without waiting (``Batcher.alone_now``). The express lane
        (``ModelRuntime.infer_now``) then runs it with ``run_now``."""
        if self._wrapped or self._turn:  # a stall injector (tests) wraps the road only; a turn's
            return False  # batch is forming: this request joins it (join_turn)
        per_work = self._inline_per_work
        inline = per_work is not None and per_work * work < self.inline_below_s
        return (inline or self._inline_mode == "true") and self.batcher.alone_now()

    # ---- a loop turn's batch: the express lane under load ----
    def turn_possible(self, work: int) -> bool:
        """Whether a request of ``work`` input elements may join a loop turn's batch
        (``join_turn``): the batcher merges and is idle (``Batcher.turn_open``), and the
        request alone would run inline, by the lower of the turns' estimate and the inline
        one (which every run feeds: a turn estimate pushed up by a busy spell comes back
        down once the turns run again)."""
        if self._wrapped or not self.batcher.turn_open():
            return False
        if self._inline_mode == "true":
            return True
        turn, inline = self._turn_per_work, self._inline_per_work
        if turn is None or inline is None:
            return False
        return min(turn, inline) * work < self.inline_below_s

    def join_turn(self, item: TurnItem) -> None:
        """Add a request that ``turn_possible`` let in to this loop turn's batch, which runs
        inline once the loop has read every socket that was ready (``call_soon``): the
        requests that came in one turn share one run of the model, without the road's tasks,
        futures and queue. Its ``done`` gets its outputs (or the exception in their place)
        and the time the batch started. A batch that this request would make too large
        (over the batcher's ``max_batch_size``, as budget-driven batching sets it, or its
        compute, estimated from the turns run so far, over ``inline_below_s``), or of
        another shape, runs now, and this request starts the next."""
        turn = self._turn
        if turn:
            per_work = self._turn_per_work
            if (
                item.signature != self._turn_signature
                or self._turn_items + item.batch_size > self.batcher.policy.max_batch_size
                or (
                    self._inline_mode != "true"
                    and per_work is not None
                    and per_work * (self._turn_work + item.work) >= self.inline_below_s
                )
            ):
                self._flush_turn()
                turn = self._turn
        if not turn:
            self._turn_signature = item.signature
            if not self._turn_scheduled:
                self._turn_scheduled = True
                asyncio.get_running_loop().call_soon(self._run_turn)
        item.arrived = now = time.perf_counter()
        self.batcher.arrived_in_turn(now, bool(turn))
        turn.append(item)
        self._turn_work += item.work
        self._turn_items += item.batch_size

    def _run_turn(self) -> None:
        self._turn_scheduled = False
        if self._turn:
            self._flush_turn()

    def _flush_turn(self) -> None:
        turn, work, items = self._turn, self._turn_work, self._turn_items
        self._turn, self._turn_work, self._turn_items = [], 0, 0
        self.batcher.left_turn(len(turn))
        started = time.perf_counter()
        index = self.batcher.take_turn()
        if index is None:  # the road took the instance in between: the turn queues there
            self._turn_to_road(turn)
            return
        answers: list[tuple[TurnItem, Arrays | BaseException, float]] = []
        try:
            self._run_on(index, turn, work, items, started, answers)
        finally:
            self.batcher.give_back(index, started)
        for it, value, at in answers:  # once the instance is back: an answer may start more work
            _answer(it, value, at, self.label)

    def _run_on(
        self,
        index: int,
        turn: list[TurnItem],
        work: int,
        items: int,
        started: float,
        answers: list[tuple[TurnItem, Arrays | BaseException, float]],
    ) -> None:
        """Run ``turn``'s batch on the instance ``index``, with an answer in ``answers`` for
        each of its requests whatever happens: a model error in a batch of several reruns
        them one by one there (isolation: only the culprit fails), a bug answers each with an
        internal error."""
        try:
            per_item, in_ns, infer_ns, out_ns = self._execute(self._backends[index], turn)
        except (BackendError, InvalidInputError) as exc:
            if len(turn) > 1:
                for it in turn:
                    self._run_on(index, [it], it.work, it.batch_size, time.perf_counter(), answers)
                return
            if isinstance(exc, BackendError):  # client data errors are the client's to see, not logs'
                log.warning("%s: %s", self.label, exc)
            answers.append((turn[0], exc, started))
            return
        except Exception as exc:  # a bug, not a model failure: still answer every request
            log.exception("%s: unexpected error running a batch", self.label)
            err = BackendError(f"internal error running model {self.label!r}: {exc}")
            answers.extend((it, err, started) for it in turn)
            return
        try:
            queue_ns = [int((started - it.arrived) * 1e9) for it in turn]
            self._account(started, work, items, queue_ns, True, in_ns, infer_ns, out_ns)
            per_work = self._turn_per_work
            if per_work is not None:  # as ``_learn``: a preempted run counts at most twice the estimate
                seen = min(infer_ns / 1e9 / max(work, 1), 2 * per_work)
                self._turn_per_work = per_work + 0.1 * (seen - per_work)
            if self.adaptive is not None:
                for it in turn:
                    self.adaptive.observe(started - it.arrived, infer_ns / 1e9)
        except Exception:  # a bug in the bookkeeping: the answers still go out
            log.exception("%s: unexpected error recording a turn's batch", self.label)
        answers.extend((it, outs, started) for it, outs in zip(turn, per_item, strict=True))

    def _turn_to_road(self, turn: list[TurnItem]) -> None:
        """A turn's requests queued in the batcher (with their deadlines and clients; their
        arrivals were counted when they joined the turn), each answered as it comes."""
        loop = asyncio.get_running_loop()
        timeout_s = self.policy.timeout_s(None)
        for it in turn:
            future: asyncio.Future[Arrays] = loop.create_future()
            queued = QueuedRequest(it.inputs, it.batch_size, it.signature, future, enqueued=it.arrived)
            queued.deadline = it.deadline
            queued.flow = it.flow
            try:
                self.batcher.submit(queued, timeout_s, counted=True)
            except Exception as exc:
                _answer(it, exc, time.perf_counter(), self.label)
                continue
            future.add_done_callback(functools.partial(_settle_from_road, queued, it, self.label))

    def run_now(self, inputs: Arrays, batch_size: int, work: int) -> tuple[Arrays, int]:
        """``inputs`` computed at once on this thread, as ``__call__`` would have run them after
        its queue's bookkeeping, when ``runs_now`` said so, and the nanoseconds the model
        took; in the estimates as the road's run is (the caller records the statistics:
        ``ModelStats.record_alone``). A model's error is raised as the road's request would
        get it."""
        started = time.perf_counter()
        index = self.batcher.take_alone(started)
        try:
            t0 = time.perf_counter_ns()
            outputs = self._backends[index].run(inputs, self._outputs)
            infer_ns = time.perf_counter_ns() - t0
        except (BackendError, InvalidInputError) as exc:
            if isinstance(exc, BackendError):  # client data errors are the client's to see, not logs'
                log.warning("%s: %s", self.label, exc)
            raise
        except Exception as exc:  # a bug, not a model failure: answered as the road answers it
            log.exception("%s: unexpected error running a batch", self.label)
            raise BackendError(f"internal error running model {self.label!r}: {exc}") from None
        finally:
            self.batcher.give_back(index, started)
        self._learn(started, work, batch_size, True, infer_ns)
        if self.adaptive is not None:
            self.adaptive.observe(0.0, infer_ns / 1e9)
        return outputs, infer_ns
