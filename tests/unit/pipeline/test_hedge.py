"""Hedged requests on fake replicas: the rolling p95, which replica is asked first, the race
(the first good answer wins, the others are cancelled), errors, and the overload guard."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from milliserve.config.step_config import PipelineStep
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.pipeline.hedge import HedgedCall, LatencyWindow
from milliserve.pipeline.steps import tensor
from milliserve.protocol.types import InferRequest
from milliserve.road import Call

from .conftest import FakeModel, Models


def test_window_gives_the_default_until_enough_samples() -> None:
    w = LatencyWindow(default_s=0.02, min_samples=10)
    for _ in range(9):
        w.observe(0.005)
    assert w.value() == 0.02
    w.observe(0.005)
    assert w.value() == pytest.approx(0.005)


def test_window_p95_of_the_recent_latencies_only() -> None:
    w = LatencyWindow(size=100, min_samples=10, every=1)
    for i in range(100):  # 1..100 ms: the p95 is the 95th value (nearest rank: milliserve.percentiles)
        w.observe((i + 1) / 1000)
    assert w.value() == pytest.approx(0.095)
    for _ in range(100):  # a faster regime replaces the old one entirely
        w.observe(0.002)
    assert w.value() == pytest.approx(0.002)


def test_window_has_a_floor() -> None:
    w = LatencyWindow(min_samples=5, floor_s=0.001, every=1)
    for _ in range(50):
        w.observe(0.00002)
    assert w.value() == 0.001


def test_window_resorts_only_every_few_observations() -> None:
    w = LatencyWindow(size=64, min_samples=4, every=8)
    for _ in range(4):
        w.observe(0.010)
    assert w.value() == pytest.approx(0.010)
    for _ in range(3):  # not yet re-sorted: the estimate lags by under `every` observations
        w.observe(1.0)
    assert w.value() == pytest.approx(0.010)
    w.observe(1.0)  # the 8th observation
    assert w.value() == pytest.approx(1.0)


def _step(**hedge: Any) -> PipelineStep:
    return PipelineStep.model_validate({"model_name": "a", "hedge": {"replicas": ["b"], **hedge}})


def _call(models: Models, **hedge: Any) -> HedgedCall:
    return HedgedCall("step 1 (model a)", _step(**hedge), ["x"], ["probabilities"], models.get_model)


def _run(step: HedgedCall, x: Any = None) -> tuple[dict[str, Any], Call]:
    tensors = {"x": tensor("x", np.asarray(x if x is not None else [[0.25, 0.75]], np.float32))}
    call = Call(InferRequest("p", "", []))

    async def go() -> None:
        await step.run(tensors, call)
        await asyncio.sleep(0.01)  # let the cancelled copies finish

    asyncio.run(go())
    return tensors, call


def test_a_slow_primary_is_hedged_and_the_loser_cancelled(models: Models) -> None:
    a = FakeModel("a", delay_s=5.0)
    b = FakeModel("b", fn=lambda x: x * 2)
    step = _call(models.add(a, b), after_ms=10)
    tensors, call = _run(step)
    np.testing.assert_allclose(tensors["probabilities"].data, [[0.5, 1.5]])
    assert call.notes["answered_by"] == "b"
    assert step.counts == {"hedges_sent": 1, "hedges_won": 1, "hedges_suppressed": 0}
    assert (a.started, a.cancelled, a.finished) == (1, 1, 0)
    assert call.stages["hedge"] >= 0.01  # the wait before the hedge went out
    assert a.requests[0].deadline is b.requests[0].deadline is None


def test_a_fast_primary_sends_no_hedge(models: Models) -> None:
    a, b = FakeModel("a"), FakeModel("b")
    step = _call(models.add(a, b), after_ms=5000)
    _, call = _run(step)
    assert call.notes["answered_by"] == "a"  # ties: the step's own model first
    assert step.counts["hedges_sent"] == 0
    assert b.started == 0
    _, call = _run(step)
    assert call.notes["answered_by"] == "b"  # then in turn


def test_the_primary_is_the_least_busy_replica(models: Models) -> None:
    a, b = FakeModel("a"), FakeModel("b")
    a.queue = 3
    _, call = _run(_call(models.add(a, b), after_ms=5000))
    assert call.notes["answered_by"] == "b"


def test_no_hedge_to_a_long_queue(models: Models) -> None:
    a, b = FakeModel("a", delay_s=0.05), FakeModel("b")
    b.queue = 4
    a.queue = 0  # still the primary: b has more pending
    step = _call(models.add(a, b), after_ms=5, max_queue=4)
    _, call = _run(step)
    assert call.notes["answered_by"] == "a"
    assert step.counts == {"hedges_sent": 0, "hedges_won": 0, "hedges_suppressed": 1}
    assert b.started == 0


def test_no_hedge_while_the_step_is_crowded(models: Models) -> None:
    a, b = FakeModel("a", delay_s=0.05), FakeModel("b", delay_s=0.05)
    step = _call(models.add(a, b), after_ms=5, max_inflight=2)
    x = tensor("x", np.zeros((1, 2), np.float32))

    async def go() -> None:
        calls = [Call(InferRequest("p", "", [])) for _ in range(4)]
        await asyncio.gather(*(step.run({"x": x}, c) for c in calls))

    asyncio.run(go())
    # four in flight, more than the two allowed: none of them hedged
    assert step.counts == {"hedges_sent": 0, "hedges_won": 0, "hedges_suppressed": 4}
    assert a.started + b.started == 4


def test_a_request_error_is_returned_at_once(models: Models) -> None:
    a = FakeModel("a", error=InvalidInputError("bad x"))
    b = FakeModel("b", delay_s=5.0)
    step = _call(models.add(a, b), after_ms=1000)
    with pytest.raises(InvalidInputError, match=r"^step 1 \(model a\): bad x$"):
        _run(step)
    assert b.started == 0


def test_a_server_error_falls_through_to_the_hedge(models: Models) -> None:
    a = FakeModel("a", delay_s=0.05, error=BackendError("boom"))
    b = FakeModel("b", delay_s=0.1)
    step = _call(models.add(a, b), after_ms=10)
    _, call = _run(step)
    assert call.notes["answered_by"] == "b"
    assert step.counts["hedges_won"] == 1


def test_every_copy_failing_raises_the_first_error(models: Models) -> None:
    a = FakeModel("a", delay_s=0.02, error=BackendError("first"))
    b = FakeModel("b", delay_s=0.05, error=BackendError("second"))
    with pytest.raises(BackendError, match="first"):
        _run(_call(models.add(a, b), after_ms=5))


def test_replicas_must_match(models: Models) -> None:
    a = FakeModel("a")
    b = FakeModel("b", outputs=("scores",))
    with pytest.raises(ConfigError, match=r"models 'a' and 'b' must have the same outputs"):
        _call(models.add(a, b))
