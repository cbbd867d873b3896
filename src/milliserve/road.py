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
new feature is a new class in a servable's list, never an ``if`` in the runtime.

Pipeline **steps** (``Step``) read and write named tensors; the tokenizer and feature
steps serve both pipelines and models (a model's road wraps them in a stage).
This module sits below ``runtime``, ``features`` and ``pipeline`` so that each can
use these types without importing the others.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from milliserve.protocol.types import InferRequest, InferTensor

__all__ = [
    "Around",
    "BatchCall",
    "Call",
    "Handler",
    "Offload",
    "Outputs",
    "Stage",
    "Step",
    "Tensors",
    "build_road",
]

Outputs = list[InferTensor]
Tensors = dict[str, InferTensor]
Handler = Callable[["Call"], Awaitable[Outputs]]
# runs a blocking callable off the event loop (the executor's CPU pool) and awaits it
Offload = Callable[..., Awaitable[Any]]


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


class _Timed:
    """A run of plain stages, each timed, then the rest of the road."""

    __slots__ = ("rest", "stages")

    def __init__(self, stages: Sequence[Stage], rest: Handler) -> None:
        self.stages = tuple(stages)
        self.rest = rest

    async def __call__(self, call: Call) -> Outputs:
        stages = call.stages
        clock = time.perf_counter
        for stage in self.stages:
            t0 = clock()
            await stage.run(call)
            name = stage.stage
            stages[name] = stages.get(name, 0.0) + (clock() - t0)
        return await self.rest(call)


def build_road(stages: Sequence[Stage | Around], terminal: Handler) -> Handler:
    """Link ``stages`` (in request order) and ``terminal`` into one callable."""
    road: Handler = terminal
    plain: list[Stage] = []
    for stage in reversed(stages):
        if isinstance(stage, Around):
            if plain:
                road = _Timed(plain[::-1], road)
                plain = []
            road = functools.partial(stage.around, rest=road)
        else:
            plain.append(stage)
    return _Timed(plain[::-1], road) if plain else road
