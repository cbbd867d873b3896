"""Hedged requests: a model step that may ask a second replica when the first is slow.

    - model_name: sentiment_model
      hedge: {replicas: [sentiment_model_b], after_ms: 0, max_extra: 1, max_queue: 4}

The request goes to the least busy of ``model_name`` and ``replicas`` (fewest requests
queued or running; ties in turn). When it has not answered within ``after_ms`` (0: the
p95 of the step's recent latencies), a copy goes to the least busy other replica, up to
``max_extra`` copies, one per period. The first successful answer wins; the other copies
are cancelled: a copy still queued at its model leaves the queue and never runs, one
already running finishes and its result is dropped. An answer that is a request error
(4xx) is returned at once, since every copy would fail alike; any other failure waits
for the copies still out.

Hedges must never turn a load spike into a collapse: no copy goes to a replica that has
``max_queue`` requests queued, nor while the step has ``max_inflight`` requests in
flight. Such a hedge is counted as suppressed. The counts (``hedges_sent``,
``hedges_won``, ``hedges_suppressed``) are the pipeline's metrics per step, and the
response parameter ``answered_by`` names the replica that answered. A replica counts the
copies cancelled because another answered first as ``milliserve_inference_hedge_lost_total``,
not as failures, so a failure-ratio alert stays quiet on a healthy hedged setup.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from milliserve.config.step_config import Hedge, PipelineStep
from milliserve.errors import ConfigError, MilliserveError, RequestError
from milliserve.percentiles import percentile
from milliserve.pipeline.steps import ModelCall
from milliserve.protocol.types import InferResponse
from milliserve.road import Call, Tensors
from milliserve.runtime.servable import HEDGE_LOST

__all__ = ["HedgedCall", "LatencyWindow", "same_io"]


class LatencyWindow:
    """A rolling quantile of the last ``size`` latencies (seconds), re-sorted every
    ``every`` observations; ``default_s`` until ``min_samples`` are in, never below
    ``floor_s`` (hedging a sub-millisecond model after its p95 only doubles its work)."""

    def __init__(
        self,
        size: int = 256,
        q: float = 0.95,
        floor_s: float = 0.001,
        default_s: float = 0.025,
        min_samples: int = 20,
        every: int = 16,
    ) -> None:
        self.size, self.q, self.floor_s, self.default_s = size, q, floor_s, default_s
        self.min_samples, self.every = min_samples, every
        self._ring: list[float] = []
        self._next = 0
        self._seen = 0
        self._value = default_s

    def observe(self, seconds: float) -> None:
        if len(self._ring) < self.size:
            self._ring.append(seconds)
        else:
            self._ring[self._next] = seconds
        self._next = (self._next + 1) % self.size
        self._seen += 1
        if len(self._ring) >= self.min_samples and (
            len(self._ring) == self.min_samples or self._seen % self.every == 0
        ):
            self._value = percentile(self._ring, 100 * self.q)

    def value(self) -> float:
        """The quantile now (``default_s`` while fewer than ``min_samples`` are in)."""
        if len(self._ring) < self.min_samples:
            return self.default_s
        return max(self.floor_s, self._value)


def same_io(models: dict[str, Any]) -> None:
    """ConfigError unless every servable in ``models`` (name -> servable) takes the same
    inputs and gives the same outputs (names, datatypes, dims)."""
    described = {
        name: (
            sorted(rt.client_inputs()),
            sorted((t.name, t.data_type, t.dims) for t in rt.config.output),
        )
        for name, rt in models.items()
    }
    first, want = next(iter(described.items()))
    for name, have in described.items():
        for what, a, b in (("inputs", want[0], have[0]), ("outputs", want[1], have[1])):
            if a != b:
                raise ConfigError(
                    f"models {first!r} and {name!r} must have the same {what}: {first!r} has "
                    f"{_spell(a)}, {name!r} has {_spell(b)}"
                )


def _spell(tensors: list[tuple[str, str, tuple[int, ...]]]) -> str:
    return "[" + ", ".join(f"{n} {d} {list(dims)}" for n, d, dims in tensors) + "]"


class HedgedCall(ModelCall):
    """A model step over replicas with hedged requests (see the module docstring)."""

    rowwise = False  # a hedge is timed per request: one slow member would hedge the others

    def __init__(
        self,
        name: str,
        step: PipelineStep,
        model_inputs: list[str],
        model_outputs: list[str],
        get: Callable[[str, str], Any],
    ) -> None:
        super().__init__(name, step, model_inputs, model_outputs, get)
        assert step.hedge is not None
        try:
            same_io({m: get(m, self.version if m == self.model else "") for m in step.models})
        except ConfigError as exc:
            raise ConfigError(f"{name}: hedge: {exc.message}") from None
        self.hedge: Hedge = step.hedge
        self.replicas = (self.model, *step.hedge.replicas)
        self.after_s = step.hedge.after_ms / 1000
        self.window = LatencyWindow()
        self.counts = {"hedges_sent": 0, "hedges_won": 0, "hedges_suppressed": 0}
        self.inflight = 0
        self._turn = 0
        self._losers: set[asyncio.Task[InferResponse]] = set()

    def _load(self, model: str) -> tuple[int, int]:
        """(pending, queued) of a replica; a replica that is not ready counts as full."""
        try:
            stats = self._get(model, self.version if model == self.model else "").stats
        except MilliserveError:
            return 1 << 30, 1 << 30
        return stats.pending(), stats.queued()

    def _primary(self) -> str:
        """The least busy replica; ties go round in turn."""
        n = len(self.replicas)
        start = self._turn
        self._turn = (start + 1) % n
        order = [self.replicas[(start + i) % n] for i in range(n)]
        return min(order, key=lambda m: self._load(m)[0])

    def _hedge_target(self, used: set[str]) -> str | None:
        """The least busy replica not asked yet, or None when the guard says no."""
        if self.inflight > self.hedge.max_inflight:
            return None
        loads = {m: self._load(m) for m in self.replicas if m not in used}
        if not loads:
            return None
        target = min(loads, key=lambda m: loads[m][0])
        return None if loads[target][1] >= self.hedge.max_queue else target

    def _send(self, model: str, tensors: Tensors, call: Call) -> asyncio.Task[InferResponse]:
        return asyncio.ensure_future(self.infer(self.request(tensors, call, model)))

    async def run(self, tensors: Tensors, call: Call) -> None:
        start = time.perf_counter()
        primary = self._primary()
        copies = {self._send(primary, tensors, call): (primary, 0.0)}
        self.inflight += 1
        try:
            winner = await self._race(copies, tensors, call, start)
        finally:
            self.inflight -= 1
            for task in copies:
                if not task.done():
                    task.cancel(HEDGE_LOST)  # counted by its replica as lost, not failed
                    self._losers.add(task)
                    task.add_done_callback(self._reap)
                elif not task.cancelled():
                    task.exception()  # a copy that failed before the winner answered: seen
        response = winner.result()
        model, sent_after = copies[winner]
        self.window.observe(time.perf_counter() - start)
        if model != primary:
            self.counts["hedges_won"] += 1
            call.stages["hedge"] = call.stages.get("hedge", 0.0) + sent_after
        self.write(response.outputs, tensors)
        self.absorb(response, call)
        call.notes["answered_by"] = model

    async def _race(
        self,
        copies: dict[asyncio.Task[InferResponse], tuple[str, float]],
        tensors: Tensors,
        call: Call,
        start: float,
    ) -> asyncio.Task[InferResponse]:
        """The first copy to answer well; sends hedges while none has."""
        pending = set(copies)
        hedging = True
        failure: BaseException | None = None
        while True:
            timeout = (self.after_s or self.window.value()) if hedging else None
            done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # no answer within the period: hedge
                target = self._hedge_target({m for m, _ in copies.values()})
                if target is None:
                    self.counts["hedges_suppressed"] += 1
                    hedging = False
                    continue
                task = self._send(target, tensors, call)
                copies[task] = (target, time.perf_counter() - start)
                pending.add(task)
                self.counts["hedges_sent"] += 1
                hedging = len(copies) <= self.hedge.max_extra
                continue
            for task in done:
                exc = task.exception()
                if exc is None:
                    return task
                if isinstance(exc, RequestError):
                    raise exc  # every copy would fail alike
                failure = failure or exc
            if not pending:
                assert failure is not None
                raise failure

    def _reap(self, task: asyncio.Task[InferResponse]) -> None:
        """A cancelled copy has finished: forget it (its result or error is dropped)."""
        self._losers.discard(task)
        if not task.cancelled():
            task.exception()
