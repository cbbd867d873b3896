"""The stages a servable's road is built from (see ``milliserve.road``). Each has one job:

- ``StepStage``: a pipeline step (tokenizer, features) in front of a model;
- ``Validate``: names, datatypes, shapes and values against the servable's inputs;
- ``Deadline``: when the answer must be out;
- ``Admit``: refusal of a request that cannot meet its deadline;
- ``CacheStage``: the response cache, around the rest of the road.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from milliserve.cache.response_cache import ResponseCache, cache_key
from milliserve.errors import DeadlineUnmeetableError
from milliserve.road import Call, Handler, Outputs, Step
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.deadline import LatencyEstimator, request_deadline
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import ModelIO, validate_request

__all__ = ["Admit", "CacheStage", "Deadline", "StepStage", "Validate", "cache_stage", "request_work"]


def request_work(call: Call) -> int:
    """The request's size for the latency estimate: its input elements."""
    return sum(t.data.size for t in call.request.inputs)


class StepStage:
    """A step that turns some of a request's inputs into others, before validation."""

    __slots__ = ("consumed", "stage", "step")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.stage = step.stage
        self.consumed = frozenset(step.needs) - frozenset(step.makes)  # the text, the entity ids

    async def run(self, call: Call) -> None:
        tensors = {t.name: t for t in call.request.inputs}
        await self.step.run(tensors, call)
        call.request.inputs = [t for n, t in tensors.items() if n not in self.consumed]


class Validate:
    """Checked before anything is queued, so a malformed request never joins a batch."""

    __slots__ = ("io", "stage")

    def __init__(self, io: ModelIO) -> None:
        self.io = io
        self.stage = "parse"  # the front end adds its decoding to the same stage

    async def run(self, call: Call) -> None:
        call.batch_size, call.signature = validate_request(call.request, self.io)


class Deadline:
    """The request's deadline: the earliest of the ``x-request-deadline-ms`` header or gRPC
    deadline, the OIP ``timeout`` and, when it gives neither, the budget's p99. First on the
    road, so every stage (a Redis lookup, a pipeline's model steps) can respect it."""

    __slots__ = ("budget_s", "delay", "stage")

    def __init__(self, budget_s: float | None, delay: bool = False) -> None:
        self.budget_s, self.delay = budget_s, delay
        self.stage = "parse"

    async def run(self, call: Call) -> None:
        r = call.request
        call.deadline = request_deadline(
            r.deadline, r.parameters, time.perf_counter(), self.budget_s, self.delay
        )


class Admit:
    """Refuse at once a request that cannot finish before its deadline (HTTP 429, gRPC
    DEADLINE_EXCEEDED), on the estimate of its queue and compute time."""

    __slots__ = ("batcher", "estimator", "instances", "label", "reprobe", "stage")

    def __init__(
        self,
        label: str,
        estimator: LatencyEstimator,
        batcher: Batcher,
        instances: int,
        reprobe: Callable[[], None] | None = None,
    ) -> None:
        self.label, self.estimator, self.batcher, self.instances = label, estimator, batcher, instances
        self.reprobe = reprobe  # re-measures the model in the background (warmup input)
        self.stage = "parse"

    async def run(self, call: Call) -> None:
        if call.deadline is not None:
            self.check(call.deadline, request_work(call))

    def check(self, deadline: float, work: int) -> None:
        """Raise DeadlineUnmeetableError for a request of ``work`` input elements that would
        miss ``deadline``."""
        b, est = self.batcher, self.estimator
        est.active = True
        now = time.perf_counter()
        need = est.needed_s(
            work,
            b.queued,
            b.free_instances,
            self.instances,
            max(1, b.policy.max_batch_size),
            now,
        )
        if need is None:
            return  # nothing known yet: admit
        queue, compute = need
        left = deadline - now
        idle = b.pending() == 0
        if queue + compute <= left or est.probe(idle, now):
            return
        if self.reprobe is not None and est.reprobe_due(idle, now):
            self.reprobe()
        raise DeadlineUnmeetableError(
            f"request to model {self.label!r} would miss its deadline: it needs about "
            f"{(queue + compute) * 1e3:.2f} ms (queue ~{queue * 1e3:.2f} ms + compute "
            f"~{compute * 1e3:.2f} ms) and has {max(left, 0.0) * 1e3:.2f} ms left; not run"
        )


class CacheStage:
    """Answers a repeated request from the cache; its own time is the lookup, the store, or
    the wait for an identical request's computation (single-flight)."""

    __slots__ = ("cache", "name", "record", "version")
    stage = "cache"  # its span's name on a traced road

    def __init__(
        self, cache: ResponseCache, name: str, version: str, record: Callable[[bool, int], None]
    ) -> None:
        self.cache, self.name, self.version, self.record = cache, name, version, record

    async def around(self, call: Call, rest: Handler) -> Outputs:
        stages = call.stages
        before = sum(stages.values())
        t0 = time.perf_counter_ns()
        key = cache_key(self.name, self.version, call.request)
        outputs, hit = await self.cache.get_or_compute(key, lambda: rest(call), deadline=call.deadline)
        elapsed = time.perf_counter_ns() - t0
        self.record(hit, elapsed)
        downstream = sum(stages.values()) - before
        stages["cache"] = stages.get("cache", 0.0) + max(0.0, elapsed / 1e9 - downstream)
        return outputs


def cache_stage(cache: ResponseCache | None, stats: ModelStats, name: str, version: str) -> list[CacheStage]:
    """The cache stage for a servable (none when its config has no cache), with its stats."""
    if cache is None:
        return []
    stats.cache_enabled = True
    stats.cache_errors = lambda: dict(cache.stats.errors)
    return [CacheStage(cache, name, version, stats.record_cache)]
