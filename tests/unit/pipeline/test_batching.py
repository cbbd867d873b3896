"""Pipeline requests sharing runs of the steps (pipeline/batching.py): who shares a batch,
what each request gets back, and that a failing batch costs only the request that failed it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from milliserve.errors import ConfigError, DeadlineUnmeetableError, InvalidInputError
from milliserve.pipeline.batching import BatchedSteps, batching_wanted
from milliserve.pipeline.steps import RulesStep, tensor
from milliserve.protocol.types import InferRequest, RequestedOutput
from milliserve.road import BatchCall, Call, Outputs


class Steps:
    """Doubles ``x`` into ``y`` and counts ``x``'s row sum into ``total``; a negative value
    fails the run (a client's bad data); every run is recorded. The first run waits for
    ``release`` so that the requests sent meanwhile queue behind it."""

    def __init__(self) -> None:
        self.runs: list[Call] = []
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, call: Call) -> Outputs:
        self.runs.append(call)
        if len(self.runs) == 1:
            self.started.set()
            await self.release.wait()
        x = np.concatenate([t.data for t in call.request.inputs if t.name == "x"])
        if (x < 0).any():
            raise InvalidInputError(f"x has a negative value in the run of {len(x)} rows")
        call.stages["preprocess"] = 0.001
        if isinstance(call, BatchCall):
            for notes, (start, end) in zip(call.part_notes, call.spans(), strict=True):
                notes["rows"] = str(end - start)
        else:
            call.notes["rows"] = str(len(x))
        call.notes["shared"] = "yes"
        return [tensor("y", x * 2), tensor("total", x.sum(1, keepdims=True))]


def _call(
    values: list[list[float]], parameters: dict[str, Any] | None = None, outputs: tuple[str, ...] = ()
) -> Call:
    x = np.asarray(values, np.float32)
    request = InferRequest(
        "p", "", [tensor("x", x)], parameters=parameters or {}, outputs=[RequestedOutput(o) for o in outputs]
    )
    return Call(request, batch_size=len(x), signature=(("x", x.shape[1:]),))


async def _served(steps: Steps, calls: list[Call]) -> list[Outputs | BaseException]:
    batched = BatchedSteps("p:1", steps, max_batch_size=16)
    await batched.start()
    try:
        first = asyncio.create_task(batched(_call([[0.0, 0.0]])))
        await steps.started.wait()  # the slot is taken: what follows queues
        rest = [asyncio.create_task(batched(c)) for c in calls]
        await asyncio.sleep(0)
        steps.release.set()
        await first
        return list(await asyncio.gather(*rest, return_exceptions=True))
    finally:
        await batched.close()


def test_requests_queued_together_share_one_run_and_each_gets_its_own_rows() -> None:
    steps = Steps()
    calls = [_call([[1.0, 2.0]]), _call([[3.0, 4.0], [5.0, 6.0]]), _call([[7.0, 8.0]], outputs=("total",))]
    answers = asyncio.run(_served(steps, calls))
    assert len(steps.runs) == 2  # the first alone, then the three queued behind it in one run
    whole = steps.runs[1]
    assert isinstance(whole, BatchCall) and whole.parts == (1, 2, 1) and whole.batch_size == 4
    a, b, c = answers
    assert not isinstance(a, BaseException) and not isinstance(b, BaseException)
    assert not isinstance(c, BaseException)
    assert [t.name for t in a] == ["y", "total"]
    np.testing.assert_array_equal(a[0].data, [[2.0, 4.0]])
    np.testing.assert_array_equal(b[0].data, [[6.0, 8.0], [10.0, 12.0]])
    assert b[0].shape == (2, 2) and b[1].shape == (2, 1)
    np.testing.assert_array_equal(b[1].data, [[7.0], [11.0]])
    assert [t.name for t in c] == ["total"]  # only what it asked for
    np.testing.assert_array_equal(c[0].data, [[15.0]])
    # each is told about its own rows; what the run tells everyone reaches everyone
    assert [call.notes for call in calls] == [
        {"shared": "yes", "rows": "1"},
        {"shared": "yes", "rows": "2"},
        {"shared": "yes", "rows": "1"},
    ]
    assert all(call.stages["preprocess"] == pytest.approx(0.001) for call in calls)
    assert all(call.stages["queue"] > 0 for call in calls)  # the wait behind the first run


def test_a_request_that_fails_the_batch_fails_alone() -> None:
    steps = Steps()
    calls = [_call([[1.0, 1.0]]), _call([[-1.0, 1.0]]), _call([[2.0, 2.0]])]
    good, bad, other = asyncio.run(_served(steps, calls))
    assert isinstance(bad, InvalidInputError) and "1 rows" in str(bad)  # its own run's error
    assert not isinstance(good, BaseException) and not isinstance(other, BaseException)
    np.testing.assert_array_equal(good[0].data, [[2.0, 2.0]])
    np.testing.assert_array_equal(other[0].data, [[4.0, 4.0]])
    # the first run, the failed batch of three, then each of the three alone
    assert [r.batch_size for r in steps.runs] == [1, 3, 1, 1, 1]


def test_a_batch_too_late_for_its_earliest_deadline_refuses_that_request_and_runs_the_rest() -> None:
    """A batch carries the earliest deadline of its members; when the steps refuse it for that
    deadline, the members holding it get the refusal (as each would at the model's door) and
    the others still run as one batch, not one by one."""

    class Door(Steps):
        async def __call__(self, call: Call) -> Outputs:
            if call.deadline is not None and call.deadline - time.perf_counter() < 1.0:
                self.runs.append(call)
                raise DeadlineUnmeetableError("would miss its deadline; not run")
            return await super().__call__(call)

    def due(values: list[list[float]], seconds: float) -> Call:
        call = _call(values)
        call.deadline = call.request.deadline = time.perf_counter() + seconds
        return call

    steps = Door()
    calls = [due([[1.0, 1.0]], 60), due([[2.0, 2.0]], 0.5), due([[3.0, 3.0]], 60), _call([[4.0, 4.0]])]
    a, tight, b, c = asyncio.run(_served(steps, calls))
    assert isinstance(tight, DeadlineUnmeetableError)
    assert not any(isinstance(x, BaseException) for x in (a, b, c))
    np.testing.assert_array_equal(c[0].data, [[8.0, 8.0]])
    # the first run, the batch of four refused, then the three others together
    assert [r.batch_size for r in steps.runs] == [1, 4, 3]
    assert isinstance(steps.runs[2], BatchCall) and steps.runs[2].parts == (1, 1, 1)


def test_only_requests_with_equal_parameters_and_shapes_share_a_run() -> None:
    steps = Steps()
    calls = [
        _call([[1.0, 1.0]], {"k": 1}),
        _call([[2.0, 2.0]], {"k": 2}),
        _call([[3.0, 3.0]], {"k": 1}),
        _call([[4.0, 4.0, 4.0]], {"k": 1}),  # another shape
        _call([[5.0, 5.0]], {"k": [1, 2]}),  # parameters that cannot be compared: alone
    ]
    answers = asyncio.run(_served(steps, calls))
    assert not any(isinstance(a, BaseException) for a in answers)
    runs = sorted(tuple(r.parts) if isinstance(r, BatchCall) else (r.batch_size,) for r in steps.runs[1:])
    assert runs == [(1,), (1,), (1,), (1, 1)]
    shared = next(r for r in steps.runs if isinstance(r, BatchCall))
    assert shared.request.parameters == {"k": 1}


def test_outputs_without_a_row_per_input_row_run_each_request_alone() -> None:
    class Summary(Steps):
        async def __call__(self, call: Call) -> Outputs:
            outputs = await super().__call__(call)
            return [tensor("count", np.asarray([call.batch_size])), *outputs]

    steps = Summary()
    answers = asyncio.run(_served(steps, [_call([[1.0, 1.0]]), _call([[2.0, 2.0]])]))
    assert [a[0].data.tolist() for a in answers if not isinstance(a, BaseException)] == [[1], [1]]


def test_which_pipelines_batch() -> None:
    rules = RulesStep("step 1", _rules())
    assert batching_wanted({}, 8, [rules])
    assert not batching_wanted({}, 0, [rules])  # no batch dimension
    assert not batching_wanted({"pipeline_batching": "false"}, 8, [rules])

    class Tokenizer:
        pass

    assert not batching_wanted({}, 8, [rules, Tokenizer()])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="pipeline_batching"):
        batching_wanted({"pipeline_batching": "sometimes"}, 8, [rules])


def _rules() -> Any:
    from milliserve.config.step_config import Rules

    return Rules.model_validate({"input": "p", "labels": ["a", "b"], "output": "label"})


def test_an_idle_slot_gathers_a_burst_that_reaches_it_over_several_turns() -> None:
    """With concurrent clients, an idle slot waits while turns of the loop bring more of
    the burst (as the server reads the rest of it from the sockets), so a burst whose
    requests reach the pipeline over three turns runs as one batch."""

    class Inline:  # steps that never await, as the fraud pipeline's do
        def __init__(self) -> None:
            self.sizes: list[int] = []

        async def __call__(self, call: Call) -> Outputs:
            self.sizes.append(call.batch_size)
            x = np.concatenate([t.data for t in call.request.inputs])
            return [tensor("y", x * 2)]

    async def late(batched: BatchedSteps, turns: int) -> Outputs:
        for _ in range(turns):
            await asyncio.sleep(0)
        return await batched(_call([[float(turns), 0.0]]))

    async def main() -> list[int]:
        steps = Inline()
        batched = BatchedSteps("p:1", steps, max_batch_size=16)
        await batched.start()
        try:
            for _ in range(5):
                batched.batcher._overlap = 1.0  # concurrent clients noticed, as a server's are
                await asyncio.gather(*(late(batched, t) for t in (0, 0, 0, 0, 0, 0, 1, 2)))
        finally:
            await batched.close()
        return steps.sizes

    sizes = asyncio.run(main())
    assert sizes == [8] * 5
