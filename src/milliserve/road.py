"""The request road: what a request carries from stage to stage, and how a servable's
stages are chained once, when it loads.

A servable (a model, a pipeline) builds a list of small objects, each with one job:

- a **stage** transforms the call and lets it go on (``async run(call)``): features,
  tokenize, validate, admit. The road times it and adds the time to ``call.stages``
  under the stage's name, so timing is recorded in one place for every servable;
- an **around** stage wraps the rest of the road (``async around(call, rest)``), for
  work that needs both sides of it, such as the response cache;
- the **terminal** produces the outputs: batch and execute for a model, the steps
  for a pipeline.

``build_road`` links them into one callable, so a request simply walks the list and a
new feature is a new class in a servable's list, never an ``if`` in the runtime. It also
links a second chain of the same stages, ``road.traced``, that records each stage's span
(its start and end, not only its time) in the request's ``SpanLog``: a servable walks it
only for a request that carries one (``request.trace``, set where tracing is on), so a
server without tracing pays nothing for it on the road (``observability/tracing.py``).

Pipeline **steps** (``Step``) read and write named tensors; the tokenizer and feature
steps serve both pipelines and models (a model's road wraps them in a stage).
This module sits below ``runtime``, ``features`` and ``pipeline`` so that each can
use these types without importing the others.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from milliserve.protocol.types import InferRequest, InferTensor

__all__ = [
    "Around",
    "BatchCall",
    "Call",
    "Handler",
    "Offload",
    "Outputs",
    "Road",
    "SpanLog",
    "Stage",
    "Step",
    "Tensors",
    "build_road",
    "gather_parts",
]

Outputs = list[InferTensor]
Tensors = dict[str, InferTensor]
Handler = Callable[["Call"], Awaitable[Outputs]]
# runs a blocking callable off the event loop (the executor's CPU pool) and awaits it
Offload = Callable[..., Awaitable[Any]]

T = TypeVar("T")


async def gather_parts(parts: Sequence[Awaitable[T]]) -> list[T]:
    """The parts of one request, run at once (they queue together and may share batches):
    their results in order, or the first failure, with the other parts cancelled."""
    tasks = [asyncio.ensure_future(p) for p in parts]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


@dataclass(slots=True, eq=False)
class Call:
    """One request on its way along a servable's road."""

    request: InferRequest
    # seconds per Server-Timing stage (parse, features, preprocess, queue, infer, ...)
    stages: dict[str, float] = field(default_factory=dict)
    # response parameters the stages want the client to see (e.g. features_defaulted)
    notes: dict[str, Any] = field(default_factory=dict)
    # absolute time.perf_counter() by which the answer must be out, set by the admit stage
    deadline: float | None = None
    batch_size: int = 1  # set by validation
    signature: Any = None  # requests with equal signatures may share a batch


@dataclass(slots=True, eq=False)
class BatchCall(Call):
    """Several requests run as one (a pipeline's batch), their rows concatenated in order:
    ``parts`` are their batch sizes. A step that tells a client something about its own rows
    (features defaulted) writes it to that request's ``part_notes``; ``notes`` go to all."""

    parts: tuple[int, ...] = ()
    part_notes: list[dict[str, Any]] = field(default_factory=list)

    def spans(self, per_row: int = 1) -> list[tuple[int, int]]:
        """Each request's [start, end) of ``per_row`` elements per row."""
        out, start = [], 0
        for n in self.parts:
            out.append((start, start + n * per_row))
            start += n * per_row
        return out


class Stage(Protocol):
    """Transforms the call in place; the road adds its time to ``call.stages[stage]``."""

    stage: str

    async def run(self, call: Call) -> None: ...


@runtime_checkable
class Around(Protocol):
    """Wraps the rest of the road (``rest``) and returns its outputs, or its own."""

    async def around(self, call: Call, rest: Handler) -> Outputs: ...


class Step(Protocol):
    """A pipeline step: reads ``needs`` from the named tensors, writes ``makes``."""

    name: str  # for messages: "step 2 (model fraud_mlp)"
    stage: str  # where its time goes in Server-Timing; "" when it records its own stages
    needs: tuple[str, ...]
    makes: tuple[str, ...]

    async def run(self, tensors: Tensors, call: Call) -> None: ...


class SpanLog:
    """The spans a traced request's road records: ``[name, start, end, parent, attributes]``
    with times from ``time.perf_counter()`` and ``parent`` the index of the enclosing span
    (-1: the request's own). A span opened with ``open`` encloses those added until it is
    closed (a servable, a cache lookup around the rest of the road, a pipeline step)."""

    __slots__ = ("parent", "spans")

    def __init__(self) -> None:
        self.spans: list[list[Any]] = []
        self.parent = -1

    def add(self, name: str, start: float, end: float, attributes: dict[str, Any] | None = None) -> int:
        self.spans.append([name, start, end, self.parent, attributes])
        return len(self.spans) - 1

    def open(self, name: str, start: float, attributes: dict[str, Any] | None = None) -> int:
        index = self.add(name, start, start, attributes)
        self.spans[index][2] = None  # open
        self.parent = index
        return index

    def close(self, index: int, end: float, attributes: dict[str, Any] | None = None) -> None:
        span = self.spans[index]
        span[2] = end
        if attributes:
            span[4] = {**(span[4] or {}), **attributes}
        self.parent = span[3]

    def absorb(self, other: SpanLog) -> None:
        """``other``'s spans (another request's, e.g. a pipeline's model step) under the span
        open here now."""
        base, under = len(self.spans), self.parent
        for name, start, end, parent, attributes in other.spans:
            self.spans.append([name, start, end, under if parent < 0 else parent + base, attributes])


class _Timed:
    """A run of plain stages, each timed, then the rest of the road. The head of a road
    also holds ``traced``: the same stages, recording their spans."""

    __slots__ = ("rest", "stages", "traced")

    def __init__(self, stages: Sequence[Stage], rest: Handler) -> None:
        self.stages = tuple(stages)
        self.rest = rest
        self.traced: Handler = rest

    async def __call__(self, call: Call) -> Outputs:
        stages = call.stages
        clock = time.perf_counter
        for stage in self.stages:
            t0 = clock()
            await stage.run(call)
            name = stage.stage
            stages[name] = stages.get(name, 0.0) + (clock() - t0)
        return await self.rest(call)


class _Recorded:
    """A run of plain stages, each timed and its span recorded, then the rest of the road."""

    __slots__ = ("rest", "stages")

    def __init__(self, stages: Sequence[Stage], rest: Handler) -> None:
        self.stages = tuple(stages)
        self.rest = rest

    async def __call__(self, call: Call) -> Outputs:
        stages = call.stages
        log: SpanLog = call.request.trace
        clock = time.perf_counter
        for stage in self.stages:
            t0 = clock()
            await stage.run(call)
            t1 = clock()
            name = stage.stage
            stages[name] = stages.get(name, 0.0) + (t1 - t0)
            log.add(name, t0, t1)
        return await self.rest(call)


class _RecordedAround:
    """An around stage (the cache) as one span that encloses the rest of the road."""

    __slots__ = ("name", "rest", "stage")

    def __init__(self, stage: Around, rest: Handler) -> None:
        self.stage, self.rest = stage, rest
        self.name = str(getattr(stage, "stage", type(stage).__name__))

    async def __call__(self, call: Call) -> Outputs:
        log: SpanLog = call.request.trace
        index = log.open(self.name, time.perf_counter())
        try:
            return await self.stage.around(call, self.rest)
        finally:
            log.close(index, time.perf_counter())


class _RecordedTerminal:
    """The terminal; when it records no span of its own (a model's batcher), the stages it
    timed (queue, infer) become spans laid end to end, ending when it returned."""

    __slots__ = ("terminal",)

    def __init__(self, terminal: Handler) -> None:
        self.terminal = terminal

    async def __call__(self, call: Call) -> Outputs:
        log: SpanLog = call.request.trace
        stages = call.stages
        before, count = dict(stages), len(log.spans)
        t0 = time.perf_counter()
        outputs = await self.terminal(call)
        end = time.perf_counter()
        if len(log.spans) == count:
            added = [(k, v - before.get(k, 0.0)) for k, v in stages.items() if v > before.get(k, 0.0)]
            start = max(t0, end - sum(d for _, d in added))
            for name, d in added:
                log.add(name, start, min(start + d, end))
                start += d
        return outputs


def _link(stages: Sequence[Stage | Around], terminal: Handler, traced: bool) -> Handler:
    road: Handler = _RecordedTerminal(terminal) if traced else terminal
    run = _Recorded if traced else _Timed
    plain: list[Stage] = []
    for stage in reversed(stages):
        if isinstance(stage, Around):
            if plain:
                road = run(plain[::-1], road)
                plain = []
            road = _RecordedAround(stage, road) if traced else functools.partial(stage.around, rest=road)
        else:
            plain.append(stage)
    return run(plain[::-1], road)


Road = _Timed


def build_road(stages: Sequence[Stage | Around], terminal: Handler) -> Road:
    """Link ``stages`` (in request order) and ``terminal`` into one callable; its ``traced``
    is the same road recording spans (for a request whose ``trace`` is a SpanLog)."""
    road = _link(stages, terminal, traced=False)
    head = road if isinstance(road, _Timed) else _Timed((), road)
    head.traced = _link(stages, terminal, traced=True)
    return head
