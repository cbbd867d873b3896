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
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from milliserve.backends.base import Backend
from milliserve.errors import BackendError, DeadlineUnmeetableError, InvalidInputError
from milliserve.protocol.types import InferRequest, InferTensor
from milliserve.road import Call, Outputs
from milliserve.runtime.adaptive import AdaptiveBatching
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.deadline import LatencyEstimator
from milliserve.runtime.executor import InstanceWorker
from milliserve.runtime.loop_turn import LoopTurn, TurnItem
from milliserve.runtime.queued_request import QueuedRequest, Runner
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import ModelIO

__all__ = ["BatchExecute"]

log = logging.getLogger(__name__)
Arrays = dict[str, np.ndarray[Any, Any]]

_INLINE_MODES = ("auto", "true", "false")


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
        self.backends = list(backends)
        self._outputs = list(io.outputs)
        runner: Runner = self._run_batch
        for wrap in around_batch:
            runner = wrap(runner)
        self.wrapped = bool(around_batch)
        self.batcher = Batcher(policy, runner, len(self.backends))
        self.workers: list[InstanceWorker] = []
        self.inline_mode = inline
        # a batch whose estimated compute is under this runs on the event loop thread
        self.inline_below_s = inline_below_s
        # seconds per input element of an inline-eligible model (None: not eligible)
        self.inline_per_work: float | None = None
        self.inline_runs = 0
        self.probe_feeds: Arrays | None = None  # the warmup input, to re-measure the model
        # the requests of this loop turn that run as one batch at its end (runtime/loop_turn.py)
        self.turn = LoopTurn(self)
        self._probes: set[asyncio.Task[None]] = set()
        self.adaptive = (
            AdaptiveBatching(self.batcher, policy, target_p99_s, instances=len(self.backends))
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
            and self.inline_mode == "auto"
        ):
            self.inline_per_work = self.turn.per_work = compute_s / max(work, 1)
        self.batcher.gather_ready = self.inline
        await self.batcher.start()

    @property
    def inline(self) -> bool:
        """Whether small batches may run on the event loop thread."""
        return self.inline_mode == "true" or self.inline_per_work is not None

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
        if self.turn.forming:  # a turn's batch still to run: its requests were accepted, as queued ones were
            self.turn.flush()
        await self.batcher.close(drain=True)
        for w in self.workers:
            w.close()
        for b in self.backends:
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
    def execute_batch(
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
        per_work = self.inline_per_work
        inline = self.inline_mode == "true" or (
            per_work is not None and per_work * work < self.inline_below_s
        )
        try:
            if inline:
                per_item, in_ns, infer_ns, out_ns = self.execute_batch(self.backends[index], batch)
            else:
                per_item, in_ns, infer_ns, out_ns = await self.workers[index].run(
                    self.execute_batch, self.backends[index], batch
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
        self.account(started, work, items, queue_ns, inline, in_ns, infer_ns, out_ns)
        for it, outs in zip(batch, per_item, strict=True):
            if not it.future.done():
                it.future.set_result(outs)

    def account(
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
        per_work = self.inline_per_work
        if per_work is not None:
            # Keep the inline estimate honest, from the runs on the worker too: once the
            # estimate is over the bound no batch runs inline, and an estimate fed by inline
            # runs only would stay there for good. A run that was preempted (a busy machine)
            # counts at most twice the estimate, so that a spike moves it by 10%, not 10x.
            seen = min(infer_ns / 1e9 / max(work, 1), 2 * per_work)
            self.inline_per_work = per_work + 0.1 * (seen - per_work)
            self.inline_runs += inline
        if self.estimator.active:
            self.estimator.observe(work, elapsed, items, started + elapsed)

    def runs_now(self, work: int) -> bool:
        """Whether a request of ``work`` input elements arriving now would run at once, alone
        and inline: a batch this small runs on the event loop's thread, and the batcher would
        hand it an idle instance without waiting (``Batcher.alone_now``). The express lane
        (``ModelRuntime.infer_now``) then runs it with ``run_now``."""
        if self.wrapped or self.turn.forming:  # a stall injector (tests) wraps the road only;
            return False  # a turn's batch is forming: this request joins it (LoopTurn.join)
        per_work = self.inline_per_work
        inline = per_work is not None and per_work * work < self.inline_below_s
        return (inline or self.inline_mode == "true") and self.batcher.alone_now()

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
            outputs = self.backends[index].run(inputs, self._outputs)
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
