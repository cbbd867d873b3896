"""The sequence batcher's scheduling (runtime/sequence_scheduler.py) with a runner that records batches:
order within a sequence, one slot per sequence, batching across sequences, the backlog,
idle sequences released, and requests for sequences that are not live refused."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from milliserve.errors import InvalidInputError
from milliserve.runtime.sequence_scheduler import Row, SeqRequest, SequenceScheduler
from milliserve.testing import wait_until_async


class Recorder:
    """Runs batches: each row's answer is its sequence's id and request value; ``hold``
    keeps a batch running until released, so that others pile up meanwhile."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[Any, int, int]]] = []  # (corr, value, row)
        self.hold: asyncio.Event | None = None

    async def __call__(self, instance: int, rows: list[Row], width: int) -> None:
        self.batches.append([(r.seq.corr, int(r.request.inputs["x"][0]), r.row) for r in rows])
        if self.hold is not None:
            await self.hold.wait()
        for r in rows:
            r.request.future.set_result({"y": r.request.inputs["x"]})


def request(value: int, start: bool = False, end: bool = False) -> SeqRequest:
    fut: asyncio.Future[dict[str, np.ndarray[Any, Any]]] = asyncio.get_running_loop().create_future()
    return SeqRequest({"x": np.array([value])}, ("x", ()), start, end, fut)


def scheduler(
    rec: Recorder, strategy: str = "direct", instances: int = 1, rows: int = 4, **kw: Any
) -> SequenceScheduler:
    return SequenceScheduler("m", strategy, instances, rows, kw.pop("idle_s", 60.0), rec, **kw)


async def send(s: SequenceScheduler, corr: Any, value: int, start: bool = False, end: bool = False) -> int:
    item = request(value, start, end)
    s.submit(corr, item)
    out = await item.future
    return int(out["y"][0])


def test_requests_of_a_sequence_run_in_order_and_sequences_share_batches(run: Any) -> None:
    async def main() -> None:
        rec = Recorder()
        s = scheduler(rec)
        await s.start()
        rec.hold = asyncio.Event()
        first = asyncio.ensure_future(send(s, 1, 0, start=True))
        await wait_until_async(
            lambda: rec.batches, 10
        )  # the first batch is running (held): the rest queue behind it
        later = [asyncio.ensure_future(send(s, 1, v)) for v in (1, 2)]
        later += [asyncio.ensure_future(send(s, "b", v, start=v == 10)) for v in (10, 11)]
        await wait_until_async(lambda: s.waiting == 4, 10)
        rec.hold.set()
        assert await asyncio.gather(first, *later) == [0, 1, 2, 10, 11]
        seen = [[v for corr, v, _ in b if corr == 1] for b in rec.batches]
        assert [v for b in seen for v in b] == [0, 1, 2]  # in order, one per batch
        assert all(len(b) <= 1 for b in seen)
        assert any(len(b) == 2 for b in rec.batches)  # the two sequences rode together
        rows = {corr: {row for b in rec.batches for c, _, row in b if c == corr} for corr in (1, "b")}
        assert len(rows[1]) == 1 and len(rows["b"]) == 1 and rows[1] != rows["b"]  # a slot each
        await s.close()

    run(main())


def test_a_sequence_must_start_and_is_gone_after_its_end(run: Any) -> None:
    async def main() -> None:
        s = scheduler(Recorder())
        await s.start()
        with pytest.raises(InvalidInputError, match="must specify the START flag"):
            s.submit(5, request(1))
        assert await send(s, 5, 1, start=True) == 1
        assert await send(s, 5, 2, end=True) == 2
        with pytest.raises(InvalidInputError, match="not active"):
            s.submit(5, request(3))
        assert await send(s, 5, 4, start=True, end=True) == 4  # a new sequence may reuse the id
        assert not s.sequences and s.slots_free() == 4
        await s.close()

    run(main())


def test_a_request_after_a_queued_end_is_refused(run: Any) -> None:
    async def main() -> None:
        rec = Recorder()
        s = scheduler(rec)
        await s.start()
        rec.hold = asyncio.Event()
        running = asyncio.ensure_future(send(s, 9, 1, start=True, end=True))
        await wait_until_async(lambda: rec.batches, 10)
        with pytest.raises(InvalidInputError, match="sequence_end"):
            s.submit(9, request(2))
        rec.hold.set()
        assert await running == 1
        await s.close()

    run(main())


def test_sequences_beyond_the_slots_wait_in_the_backlog(run: Any) -> None:
    async def main() -> None:
        rec = Recorder()
        s = scheduler(rec, rows=1)  # one slot: one sequence at a time
        await s.start()
        assert await send(s, "a", 1, start=True) == 1
        waiting = asyncio.ensure_future(send(s, "b", 2, start=True))
        await wait_until_async(lambda: s.backlog, 10)
        assert not waiting.done() and s.backlog[0].corr == "b"
        assert await send(s, "a", 3, end=True) == 3  # "a" ends: "b" takes its slot
        assert await waiting == 2
        await s.close()

    run(main())


def test_an_idle_sequence_is_released(run: Any) -> None:
    async def main() -> None:
        s = scheduler(Recorder(), idle_s=0.05)
        await s.start()
        assert await send(s, 3, 1, start=True) == 1
        assert s.reap(time.monotonic()) == []  # not idle yet
        assert s.reap(time.monotonic() + 1.0) == [3]
        assert s.slots_free() == 4
        with pytest.raises(InvalidInputError, match="idle longer than max_sequence_idle_microseconds"):
            s.submit(3, request(2))
        await s.close()

    run(main())


def test_oldest_batches_distinct_sequences_on_candidates(run: Any) -> None:
    async def main() -> None:
        rec = Recorder()
        s = scheduler(rec, "oldest", instances=2, rows=2, max_candidates=3)
        await s.start()
        assert s.capacity == 3
        rec.hold = asyncio.Event()
        calls = [asyncio.ensure_future(send(s, c, c, start=True)) for c in range(1, 7)]
        await wait_until_async(lambda: len(s.sequences) == 6, 10)
        rec.hold.set()
        assert await asyncio.gather(*calls) == [1, 2, 3, 4, 5, 6]
        assert all(len(b) <= 2 for b in rec.batches)  # max_batch_size
        assert all(len({c for c, _, _ in b}) == len(b) for b in rec.batches)
        assert {len(p) for p in s.placed} == {3}  # three candidates on each instance
        await s.close()

    run(main())


def test_the_queue_delay_waits_for_more_sequences_only_while_some_could_send(run: Any) -> None:
    async def main() -> None:
        rec = Recorder()
        s = scheduler(rec, "oldest", rows=4, delay_s=10.0, target_batch=4)
        await s.start()
        # a lone sequence: nobody else could send, so it never waits the 10 s
        assert await asyncio.wait_for(send(s, 1, 1, start=True), 5) == 1
        # sequence 2 waits for sequence 1 (live, idle): 1 sends, and they batch at once
        two = asyncio.ensure_future(send(s, 2, 2, start=True))
        await wait_until_async(lambda: s.waiting == 1, 10)
        assert not two.done()
        assert await asyncio.wait_for(asyncio.gather(two, send(s, 1, 3)), 5) == [2, 3]
        assert sorted(v for _, v, _ in rec.batches[-1]) == [2, 3]
        await s.close()

    run(main())
