"""A fake servable for the steps that call models (hedge, cascade): a numpy function with a
delay or an error, and the statistics a replica exposes (pending and queued requests)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from milliserve.config.model_config import ModelConfig
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor
from milliserve.runtime.stats import ModelStats

Array = np.ndarray[Any, Any]


class FakeModel:
    """``x`` FP32 [batch, 2] in, ``probabilities`` FP32 [batch, 2] = ``fn(x)`` out, after
    ``delay_s``; raises ``error`` instead when set. Counts started, finished and cancelled calls."""

    def __init__(
        self,
        name: str,
        fn: Callable[[Array], Array] | None = None,
        delay_s: float = 0.0,
        error: Exception | None = None,
        outputs: tuple[str, ...] = ("probabilities",),
    ) -> None:
        spec = {"data_type": "TYPE_FP32", "dims": [2]}
        self.config = ModelConfig(
            name=name,
            max_batch_size=8,
            input=[{"name": "x", **spec}],
            output=[{"name": o, **spec} for o in outputs],
        )
        self.fn = fn or (lambda x: x)
        self.delay_s, self.error = delay_s, error
        self.stats = ModelStats(name, "1")
        self.queue = 0
        self.stats.queued = lambda: self.queue
        self.stats.pending = lambda: self.queue + self.running
        self.running = self.started = self.finished = self.cancelled = 0
        self.requests: list[InferRequest] = []

    def client_inputs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, t.data_type, t.dims) for t in self.config.input]

    async def infer(self, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        self.started += 1
        self.running += 1
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        if self.error is not None:
            raise self.error
        self.finished += 1
        y = np.asarray(self.fn(request.inputs[0].data), dtype=np.float32)
        outs = [InferTensor(t.name, "FP32", tuple(y.shape), y) for t in self.config.output]
        return InferResponse(self.config.name, "1", outs, timings={"infer": self.delay_s})


class Models(dict[str, FakeModel]):
    """name -> FakeModel, with the registry's lookup (``get(name, version)``)."""

    def add(self, *models: FakeModel) -> Models:
        for m in models:
            self[m.config.name] = m
        return self

    def get_model(self, name: str, version: str = "") -> FakeModel:
        return self[name]


@pytest.fixture
def models() -> Models:
    return Models()
