"""The batcher's queue between clients (issue 24, item 5): flows (client connections) take
turns, a full queue refuses the flow that holds the most, and a request leaving the queue
never has its tensors formatted (``deque.remove`` formats a missing item's repr into its
ValueError: 4,000 cancelled requests held the event loop for 2 s)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from milliserve.errors import QueueFullError
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.queued_request import QueuedRequest


class Gate:
    """A runner whose batches wait for ``open`` and record what ran, batch by batch."""

    def __init__(self) -> None:
        self.ran: list[list[str]] = []
        self.open = asyncio.Event()

    async def __call__(self, batch: list[QueuedRequest], index: int) -> None:
        await self.open.wait()
        self.ran.append([f"{it.flow}{int(it.inputs['x'][0, 0])}" for it in batch])
        for it in batch:
            if not it.future.done():
                it.future.set_result({"y": it.inputs["x"]})


class Unprintable(np.ndarray):
    """A tensor that fails the test if anything formats its values."""

    def __repr__(self) -> str:
        raise AssertionError("a queued request's tensor values were formatted")

    __str__ = __repr__


def _item(flow: str, v: int) -> QueuedRequest:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    x = np.full((1, 2), v, np.float32).view(Unprintable)
    return QueuedRequest({"x": x}, 1, (("x", (2,)),), fut, flow=flow)


def test_a_queued_requests_repr_names_its_shapes_not_its_values() -> None:
    async def main() -> None:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        x = np.full((1, 2), 1, np.float32).view(Unprintable)
        text = repr(QueuedRequest({"x": x}, 1, (("x", (2,)),), fut))
        assert "x: [1, 2]" in text and "batch_size=1" in text

    asyncio.run(main())


def test_flows_take_turns_in_the_queue(poll: Any) -> None:
    """Flow a queues six requests, then flow b one: b's rides in the first batch after the
    running one, not behind all of a's."""

    async def main() -> None:
        gate = Gate()
        b = Batcher(BatchPolicy("m", merge=True, max_batch_size=2), gate, 1)
        await b.start()
        first = asyncio.ensure_future(b.execute(_item("a", 0), None))
        await poll.until_async(lambda: b.inflight == 1, what="the first batch running")
        tasks = [asyncio.ensure_future(b.execute(_item("a", v), None)) for v in range(1, 7)]
        await poll.until_async(lambda: b.queued == 6, what="a's requests queued")
        tasks.append(asyncio.ensure_future(b.execute(_item("b", 1), None)))
        await poll.until_async(lambda: b.queued == 7, what="b's request queued")
        gate.open.set()
        await asyncio.gather(first, *tasks)
        assert gate.ran[0] == ["a0"]
        assert gate.ran[1] == ["a1", "b1"], gate.ran
        assert [x for batch in gate.ran for x in batch if x.startswith("a")] == [f"a{v}" for v in range(7)]
        await b.close()

    asyncio.run(main())


def test_a_full_queue_refuses_the_flow_that_holds_the_most(poll: Any) -> None:
    """max_queue_size 4, all of it a's: b's request is taken and a's newest refused in its
    place; a's next one is refused itself."""

    async def main() -> None:
        gate = Gate()
        b = Batcher(BatchPolicy("m", merge=True, max_batch_size=8, max_queue_size=4), gate, 1)
        await b.start()
        first = asyncio.ensure_future(b.execute(_item("a", 0), None))
        await poll.until_async(lambda: b.inflight == 1, what="the first batch running")
        items = [_item("a", v) for v in range(1, 5)]
        for it in items:
            b.submit(it, None)
        items.append(_item("b", 1))
        b.submit(items[-1], None)  # room made: a's newest refused
        assert isinstance(items[3].future.exception(), QueueFullError)
        assert b.queued == 4
        with pytest.raises(QueueFullError):
            b.submit(_item("a", 9), None)  # a holds the most: refused itself
        gate.open.set()
        await first
        await asyncio.gather(*(it.future for i, it in enumerate(items) if i != 3))
        assert sorted(x for batch in gate.ran for x in batch) == ["a0", "a1", "a2", "a3", "b1"]
        await b.close()

    asyncio.run(main())
