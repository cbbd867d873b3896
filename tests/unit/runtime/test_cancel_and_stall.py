"""A cancelled request leaves the batcher's queue at once and never runs (what a hedged copy
that lost relies on); the test-only stall injector holds the instance like a slow compute."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from milliserve.config.model_config import ModelConfig
from milliserve.errors import ConfigError
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.queued_request import QueuedRequest
from milliserve.runtime.stall import StallInjector, stall_injectors


class Gate:
    """A runner whose batches wait for ``open`` and record what ran."""

    def __init__(self) -> None:
        self.ran: list[list[int]] = []
        self.open = asyncio.Event()

    async def __call__(self, batch: list[QueuedRequest], index: int) -> None:
        await self.open.wait()
        self.ran.append([int(it.inputs["x"][0, 0]) for it in batch])
        for it in batch:
            if not it.future.done():
                it.future.set_result({"y": it.inputs["x"]})


def _item(v: int) -> QueuedRequest:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    return QueuedRequest({"x": np.full((1, 2), v, np.float32)}, 1, (("x", (2,)),), fut)


def test_a_cancelled_queued_request_leaves_the_queue_and_never_runs(poll: Any) -> None:
    async def main() -> None:
        gate = Gate()
        b = Batcher(BatchPolicy("m", merge=True, max_batch_size=8, max_queue_size=2), gate, 1)
        await b.start()
        first = asyncio.ensure_future(b.execute(_item(1), None))  # takes the one instance
        await poll.until_async(lambda: b.inflight == 1, what="the first batch running")
        waiting = [asyncio.ensure_future(b.execute(_item(v), None)) for v in (2, 3)]
        await poll.until_async(lambda: b.queued == 2, what="two requests queued")
        waiting[0].cancel()
        await poll.until_async(lambda: b.queued == 1, what="the cancelled request gone")
        assert b.pending() == 2  # the running one and the one still queued
        b.submit(_item(4), None)  # room again under max_queue_size
        gate.open.set()
        await first
        await waiting[1]
        await poll.until_async(lambda: b.pending() == 0, what="the batcher idle")
        assert sorted(v for batch in gate.ran for v in batch) == [1, 3, 4]
        await b.close()

    asyncio.run(main())


def test_a_stall_holds_the_instance_even_when_its_caller_goes(poll: Any) -> None:
    async def main() -> None:
        gate = Gate()
        gate.open.set()
        stall = StallInjector(0.2, 1.0)
        b = Batcher(BatchPolicy("m"), stall(gate), 1)
        await b.start()
        task = asyncio.ensure_future(b.execute(_item(1), None))
        await poll.until_async(lambda: b.inflight == 1, what="the stalled batch running")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # cancelled, the caller returned only once the batch had waited out its stall and run
        assert b.inflight == 0 and gate.ran == [[1]]
        assert stall.stalls == 1
        await b.close()

    asyncio.run(main())


def test_stalls_are_seeded_and_configured() -> None:
    async def main(seed: int) -> list[int]:
        stall = StallInjector(0.0, 0.3, seed)
        ran: list[int] = []

        async def runner(batch: list[QueuedRequest], index: int) -> None:
            ran.append(stall.stalls)

        wrapped = stall(runner)
        for _ in range(50):
            await wrapped([], 0)
        return ran

    assert asyncio.run(main(1)) == asyncio.run(main(1))
    assert 5 <= asyncio.run(main(1))[-1] <= 25

    def config(**p: str) -> ModelConfig:
        return ModelConfig(name="m", parameters=p)

    assert stall_injectors(config()) == []
    [s] = stall_injectors(config(test_stall_ms="20", test_stall_probability="0.05"))
    assert (s.stall_s, s.probability) == (0.02, 0.05)
    with pytest.raises(ConfigError, match=r"'test_stall_probability' must be a number in \[0, 1\], got '2'"):
        stall_injectors(config(test_stall_ms="20", test_stall_probability="2"))
    with pytest.raises(ConfigError, match="need test_stall_ms"):
        stall_injectors(config(test_stall_probability="0.5"))


def test_a_batch_others_ride_in_finishes_when_the_caller_that_started_it_is_cancelled(poll: Any) -> None:
    async def main() -> None:
        gate = Gate()
        gate.open.set()
        b = Batcher(BatchPolicy("m", merge=True, max_batch_size=8), gate, 1)
        b.gather_ready = True  # as for a model whose batches are gathered on the direct path
        await b.start()
        for v in range(15):  # sequential callers: the 16th direct call gathers companions
            await b.execute(_item(100 + v), None)
        gate.open.clear()
        leader = asyncio.ensure_future(b.execute(_item(1), None))
        riders = [asyncio.ensure_future(b.execute(_item(v), None)) for v in (2, 3)]
        await poll.until_async(lambda: b.inflight == 1 and b.queued == 0, what="one batch running")
        leader.cancel()  # the caller that started the batch goes away mid-compute
        await asyncio.sleep(0)
        gate.open.set()
        results = await asyncio.wait_for(asyncio.gather(*riders), timeout=30)
        assert [float(r["y"][0, 0]) for r in results] == [2.0, 3.0]
        assert gate.ran[-1] == [1, 2, 3]  # they rode in the leader's batch
        with pytest.raises(asyncio.CancelledError):
            await leader
        await poll.until_async(lambda: b.pending() == 0, what="the batcher idle")
        await b.close()

    asyncio.run(main())
