"""The stages of a model's road on their own: deadline admission refuses what cannot make
it, lets an idle model be re-measured, and the road times each plain stage once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from milliserve.errors import DeadlineUnmeetableError
from milliserve.protocol.types import InferRequest
from milliserve.road import Call, build_road
from milliserve.runtime.deadline import LatencyEstimator
from milliserve.runtime.stages import Admit
from milliserve.testing import InProcessServer, wait_until_async


def _admit(estimator: LatencyEstimator, reprobe: Callable[[], None] | None = None) -> Admit:
    idle = SimpleNamespace(
        queued=0, free_instances=1, pending=lambda: 0, policy=SimpleNamespace(max_batch_size=8)
    )
    return Admit("m", estimator, idle, 1, reprobe)  # type: ignore[arg-type]


def _call(deadline_in_s: float) -> Call:
    import time

    call = Call(InferRequest("m", "", []))
    call.deadline = time.perf_counter() + deadline_in_s
    return call


def test_a_load_time_probe_that_says_refuse_is_re_measured_in_the_background() -> None:
    calls: list[int] = []
    est = LatencyEstimator(prior_s=0.5)  # probed at load on a busy machine: 500 ms
    admit = _admit(est, lambda: calls.append(1))
    with pytest.raises(DeadlineUnmeetableError, match="would miss its deadline"):
        asyncio.run(admit.run(_call(0.05)))
    assert calls == [1]  # the request is refused, and the model re-measured meanwhile
    with pytest.raises(DeadlineUnmeetableError):
        asyncio.run(admit.run(_call(0.05)))
    assert calls == [1]  # at most once per probe interval
    asyncio.run(admit.run(_call(10.0)))  # one that can make it is admitted


def test_the_road_times_each_plain_stage_and_runs_them_in_order() -> None:
    seen: list[str] = []

    class Mark:
        def __init__(self, name: str, stage: str) -> None:
            self.name, self.stage = name, stage

        async def run(self, call: Call) -> None:
            seen.append(self.name)

    class Wrap:
        async def around(self, call: Call, rest: Any) -> Any:
            seen.append("around:before")
            out = await rest(call)
            seen.append("around:after")
            return out

    async def terminal(call: Call) -> list[Any]:
        seen.append("terminal")
        return []

    road = build_road([Mark("a", "parse"), Mark("b", "parse"), Wrap(), Mark("c", "features")], terminal)
    call = Call(InferRequest("m", "", []))
    asyncio.run(road(call))
    assert seen == ["a", "b", "around:before", "c", "terminal", "around:after"]
    assert set(call.stages) == {"parse", "features"}  # a and b both added to parse


def test_a_models_reprobe_runs_its_warmup_input(
    tmp_path: Path, write_add_sub: Callable[..., Path], run: Any
) -> None:
    write_add_sub(tmp_path, config='name: "add_sub"\nmax_batch_size: 8\ndynamic_batching { }\n')

    async def main() -> None:
        async with InProcessServer(tmp_path, listen=False) as server:
            model = server.registry.get("add_sub")
            model.estimator.active = True  # type: ignore[attr-defined]
            before = model.stats.execution_count
            model.execute.reprobe()  # type: ignore[attr-defined]
            await wait_until_async(lambda: model.stats.execution_count > before, what="the probe ran")
            assert model.estimator.last_observed > 0  # type: ignore[attr-defined]

    run(main())
