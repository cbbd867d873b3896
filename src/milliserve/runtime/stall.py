"""For tests and benchmarks only: make a model's batches stall now and then.

A replica that is slow part of the time (a noisy neighbour, a GC pause, a cold cache) is
what hedged requests (pipeline/hedge.py) are for; to measure them, a model's config can
ask for it:

    parameters: {test_stall_ms: "20", test_stall_probability: "0.05", test_stall_seed: "0"}

Each batch then holds its instance ``test_stall_ms`` longer, with that probability (drawn
from a generator seeded with ``test_stall_seed``, default 0), before it runs. The stall
is an ``asyncio.sleep`` around the batch, so it holds the instance the way a slow compute
does, whether the model runs inline or on its worker thread, and blocks nothing else. As
with a compute, a caller cancelled during the stall cannot cut it short: the batch still
waits it out and runs (its other requests need their answers); the cancelled caller's
result is dropped. Loading such a model logs a warning: never set these in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from milliserve.config.model_config import ModelConfig
from milliserve.errors import ConfigError
from milliserve.runtime.queued_request import QueuedRequest, Runner

__all__ = ["StallInjector", "stall_injectors"]

log = logging.getLogger(__name__)


class StallInjector:
    """Wraps a batcher's runner: with ``probability``, sleep ``stall_s`` before the batch."""

    def __init__(self, stall_s: float, probability: float, seed: int = 0) -> None:
        self.stall_s, self.probability = stall_s, probability
        self._rng = random.Random(seed)
        self.stalls = 0

    def __call__(self, runner: Runner) -> Runner:
        async def stalled(batch: list[QueuedRequest], index: int) -> None:
            if self._rng.random() >= self.probability:
                await runner(batch, index)
                return
            self.stalls += 1

            async def slow() -> None:
                await asyncio.sleep(self.stall_s)
                await runner(batch, index)

            task = asyncio.ensure_future(slow())
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await task
                raise

        return stalled


def _number(config: ModelConfig, key: str, default: str, low: float, high: float) -> float:
    raw = config.parameters.get(key, default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise ConfigError(f"parameter {key!r} must be a number in [{low:g}, {high:g}], got {raw!r}")
    return value


def stall_injectors(config: ModelConfig) -> list[StallInjector]:
    """The stall injector the config asks for (``test_stall_ms``), or none. ConfigError for
    a value out of range."""
    if "test_stall_ms" not in config.parameters:
        unused = [k for k in ("test_stall_probability", "test_stall_seed") if k in config.parameters]
        if unused:
            raise ConfigError(f"parameters {unused} need test_stall_ms")
        return []
    stall_ms = _number(config, "test_stall_ms", "0", 0.0, 600_000.0)
    probability = _number(config, "test_stall_probability", "1", 0.0, 1.0)
    seed = _number(config, "test_stall_seed", "0", 0.0, 2.0**32)
    log.warning(
        "model %r stalls %g ms on %g%% of its batches (test_stall_ms): for tests and "
        "benchmarks only, never in production",
        config.name,
        stall_ms,
        probability * 100,
    )
    return [StallInjector(stall_ms / 1000, probability, int(seed))]
