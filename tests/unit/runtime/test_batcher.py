"""The dynamic batcher on its own: a runner that records the batches it gets."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from milliserve.errors import InvalidInputError, QueueFullError, QueueTimeoutError, ServerShuttingDownError
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.queued_request import QueuedRequest


class Recorder:
    """A runner that sleeps ``work_s`` per batch and answers each request with its own input."""

    def __init__(self, work_s: float = 0.0) -> None:
        self.work_s = work_s
        self.batches: list[list[int]] = []
        self.instances_busy = 0
        self.max_parallel = 0

    async def __call__(self, batch: list[QueuedRequest], index: int) -> None:
        self.batches.append([int(it.inputs["x"].reshape(-1)[0]) for it in batch])
        self.instances_busy += 1
        self.max_parallel = max(self.max_parallel, self.instances_busy)
        try:
            if self.work_s:
                await asyncio.sleep(self.work_s)
        finally:
            self.instances_busy -= 1
        for it in batch:
            if not it.future.done():
                it.future.set_result({"y": it.inputs["x"]})


def item(value: int, batch: int = 1, width: int = 4, priority: int = 0) -> QueuedRequest:
    x = np.full((batch, width), value, dtype=np.float32)
    fut = asyncio.get_running_loop().create_future()
    return QueuedRequest({"x": x}, batch, (("x", (width,)),), fut, priority)


def policy(**kw: Any) -> BatchPolicy:
    base: dict[str, Any] = {"label": "m", "merge": True, "max_batch_size": 8}
    base.update(kw)
    return BatchPolicy(**base)


async def busy(runner: Recorder, poll: Any) -> None:
    """Wait until the runner has taken its first batch: the instance is now busy with it."""
    await poll.until_async(lambda: runner.batches, what="the first batch reaching the runner")


async def started(p: BatchPolicy, runner: Recorder, instances: int = 1) -> Batcher:
    b = Batcher(p, runner, instances)
    await b.start()
    return b


def test_lone_request_does_not_wait_for_the_queue_delay(run: Any) -> None:
    async def main() -> float:
        rec = Recorder()
        b = await started(policy(preferred_batch_sizes=(8,), max_queue_delay_s=2.0), rec)
        t0 = time.perf_counter()
        it = item(1)
        b.submit(it, None)
        await it.future
        took = time.perf_counter() - t0
        await b.close()
        return took

    # a 2 s window exists, but nothing else is arriving: dispatch at once (in microseconds
    # idle; the bound is for a loaded machine and still far from the window)
    assert run(main()) < 1.0


def test_requests_arriving_while_busy_form_the_next_batch(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.05)
        b = await started(policy(), rec)
        first = item(0)
        b.submit(first, None)
        await busy(rec, poll)
        rest = [item(i) for i in range(1, 6)]
        for it in rest:
            b.submit(it, None)
        await asyncio.gather(first.future, *(it.future for it in rest))
        await b.close()
        return rec.batches

    assert run(main()) == [[0], [1, 2, 3, 4, 5]]


def test_batches_respect_max_batch_size_counting_batch_dims(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.02)
        b = await started(policy(max_batch_size=4), rec)
        blocker = item(99)
        b.submit(blocker, None)
        await busy(rec, poll)
        items = [item(1, batch=3), item(2, batch=2), item(3, batch=1), item(4, batch=1)]
        for it in items:
            b.submit(it, None)
        await asyncio.gather(blocker.future, *(it.future for it in items))
        await b.close()
        return rec.batches

    # 3 + 2 > 4, so request 2 starts the next batch; FIFO order is kept
    assert run(main()) == [[99], [1], [2, 3, 4]]


def test_different_non_batch_shapes_are_never_merged(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.02)
        b = await started(policy(), rec)
        blocker = item(0)
        b.submit(blocker, None)
        await busy(rec, poll)
        items = [item(1, width=4), item(2, width=5), item(3, width=4), item(4, width=5)]
        for it in items:
            b.submit(it, None)
        await asyncio.gather(blocker.future, *(it.future for it in items))
        await b.close()
        return rec.batches

    assert run(main()) == [[0], [1, 3], [2, 4]]


def test_full_queue_rejects_at_once(run: Any, poll: Any) -> None:
    async def main() -> None:
        rec = Recorder(work_s=0.05)
        b = await started(policy(max_queue_size=2), rec)
        running = item(0)
        b.submit(running, None)
        await busy(rec, poll)
        queued = [item(1), item(2)]
        for it in queued:
            b.submit(it, None)
        with pytest.raises(QueueFullError, match="max_queue_size 2"):
            b.submit(item(3), None)
        await asyncio.gather(running.future, *(it.future for it in queued))
        await b.close()

    run(main())


def test_request_that_expires_in_the_queue_is_dropped_with_a_clear_error(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.2)  # far longer than the 20 ms timeout, even on a loaded machine
        b = await started(policy(), rec)
        running = item(0)
        b.submit(running, None)
        await busy(rec, poll)
        late = item(1)
        b.submit(late, timeout_s=0.02)
        ok = item(2)
        b.submit(ok, None)
        with pytest.raises(QueueTimeoutError, match="timed out"):
            await late.future
        await asyncio.gather(running.future, ok.future)
        await b.close()
        return rec.batches

    # the expired request never reached the runner
    assert run(main()) == [[0], [2]]


def test_delay_action_lets_fresh_requests_go_first(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.2)  # far longer than the 10 ms timeout, even on a loaded machine
        b = await started(policy(merge=False, delay_on_timeout=True), rec)
        running = item(0)
        b.submit(running, None)
        await busy(rec, poll)
        expiring = item(1)
        b.submit(expiring, timeout_s=0.01)
        fresh = item(2)
        b.submit(fresh, None)
        await asyncio.gather(running.future, expiring.future, fresh.future)
        await b.close()
        return rec.batches

    assert run(main()) == [[0], [2], [1]]


def test_higher_priority_is_served_first(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.03)
        p = policy(merge=False, priority_levels=2, default_priority_level=2)
        b = await started(p, rec)
        running = item(0)
        b.submit(running, None)
        await busy(rec, poll)
        low = item(1, priority=p.priority_index(2))
        high = item(2, priority=p.priority_index(1))
        b.submit(low, None)
        b.submit(high, None)
        await asyncio.gather(running.future, low.future, high.future)
        await b.close()
        return rec.batches

    assert run(main()) == [[0], [2], [1]]


def test_priority_and_timeout_parameters_are_validated() -> None:
    p = policy(priority_levels=2, default_priority_level=1, default_timeout_us=1000)
    assert p.priority_index(0) == 0
    assert p.priority_index(2) == 1
    with pytest.raises(InvalidInputError, match=r"1\.\.2"):
        p.priority_index(3)
    assert p.timeout_s(None) == pytest.approx(0.001)
    assert p.timeout_s(500) == pytest.approx(0.0005)  # shorter than the default is always allowed
    assert p.timeout_s(5000) == pytest.approx(0.001)  # longer needs allow_timeout_override
    with pytest.raises(InvalidInputError, match="timeout"):
        p.timeout_s(-1)


def test_instances_run_batches_in_parallel(run: Any) -> None:
    async def main() -> int:
        rec = Recorder(work_s=0.05)
        b = await started(policy(merge=False), rec, instances=3)
        items = [item(i) for i in range(6)]
        for it in items:
            b.submit(it, None)
        await asyncio.gather(*(it.future for it in items))
        await b.close()
        return rec.max_parallel

    assert run(main()) == 3


def test_queue_delay_grows_a_batch_when_requests_overlap(run: Any) -> None:
    async def main(delay_s: float) -> list[list[int]]:
        rec = Recorder(work_s=0.006)
        b = await started(policy(preferred_batch_sizes=(4,), max_queue_delay_s=delay_s), rec)
        futures = []
        for i in range(24):  # open loop: a request every 5 ms, each finds another one pending
            it = item(i)
            b.submit(it, None)
            futures.append(it.future)
            await asyncio.sleep(0.005)  # pacing the load: part of what is tested
        await asyncio.gather(*futures)
        await b.close()
        return rec.batches

    without = run(main(0.0))
    with_delay = run(main(0.2))
    assert max(len(bt) for bt in without) <= 2  # work-conserving: dispatched as soon as an instance is free
    assert [len(bt) for bt in with_delay].count(4) >= 4  # the window lets batches reach the preferred size


def test_sequential_client_never_waits_for_the_window(run: Any) -> None:
    async def main() -> float:
        rec = Recorder()
        b = await started(policy(preferred_batch_sizes=(8,), max_queue_delay_s=1.0), rec)
        t0 = time.perf_counter()
        for i in range(20):  # arrives back to back, but only after the previous answer
            it = item(i)
            b.submit(it, None)
            await it.future
        took = time.perf_counter() - t0
        await b.close()
        return took

    assert run(main()) < 0.5  # 20 requests; one wasted window alone would be 1 s


def test_close_drains_queued_requests_and_then_refuses(run: Any) -> None:
    async def main() -> None:
        rec = Recorder(work_s=0.02)
        b = await started(policy(merge=False), rec)
        items = [item(i) for i in range(3)]
        for it in items:
            b.submit(it, None)
        await b.close(drain=True)
        assert all(it.future.done() and not it.future.exception() for it in items)
        with pytest.raises(ServerShuttingDownError):
            b.submit(item(9), None)

    run(main())


def test_cancelled_request_is_skipped(run: Any, poll: Any) -> None:
    async def main() -> list[list[int]]:
        rec = Recorder(work_s=0.03)
        b = await started(policy(), rec)
        running = item(0)
        b.submit(running, None)
        await busy(rec, poll)
        gone, kept = item(1), item(2)
        b.submit(gone, None)
        b.submit(kept, None)
        gone.future.cancel()
        await asyncio.gather(running.future, kept.future)
        await b.close()
        return rec.batches

    assert run(main()) == [[0], [2]]


def test_inline_batches_gather_the_requests_already_read(run: Any) -> None:
    """A model run on the event loop (a runner that never awaits) blocks the loop while it
    runs, so nothing can queue behind it unless the idle instance first yields the loop once.
    With concurrent clients the batcher does, and the requests already read share the batch;
    a sequential client (no overlap) is not made to yield."""

    async def main() -> tuple[list[list[int]], list[list[int]]]:
        runner = Recorder()  # work_s 0: never awaits, like an inline model
        b = await started(policy(), runner)
        b.gather_ready = True
        for k in range(30):  # sequential: one request at a time
            await b.execute(item(k), None)
        sequential = list(runner.batches)
        runner.batches.clear()
        for wave in range(30):  # 8 clients whose requests arrive together
            await asyncio.gather(*(b.execute(item(100 * wave + i), None) for i in range(8)))
        await b.close()
        return sequential, runner.batches

    sequential, concurrent = run(main())
    assert all(len(batch) == 1 for batch in sequential)
    assert max(len(batch) for batch in concurrent[-40:]) >= 4  # once concurrency is noticed
    assert sorted(x for batch in concurrent for x in batch) == sorted(
        100 * w + i for w in range(30) for i in range(8)
    )


def test_gathering_goes_on_while_turns_bring_companions(run: Any) -> None:
    """An idle instance that gathers for several turns (a pipeline's batcher) takes in a
    request that reaches the batcher one turn after the first companions, as the rest of a
    burst does once the loop has read the sockets again; with one turn (a model's) that
    request waits for the next batch. A turn that brings nobody ends the gathering."""

    async def late(b: Batcher, value: int, turns: int) -> None:
        for _ in range(turns):  # reaches the batcher this many turns after the others
            await asyncio.sleep(0)
        await b.execute(item(value), None)

    async def main(turns: int) -> list[list[int]]:
        runner = Recorder()  # never awaits: the batch runs where it is taken
        b = await started(policy(), runner)
        b.gather_ready, b.gather_turns = True, turns
        b._overlap = 1.0  # concurrent clients noticed
        await asyncio.gather(b.execute(item(0), None), b.execute(item(1), None), late(b, 2, 1), late(b, 3, 3))
        await b.close()
        return runner.batches

    # turn 1 brings 1, turn 2 brings 2, turn 3 brings nobody: 3 (two turns later still) waits
    assert run(main(3)) == [[0, 1, 2], [3]]
    one_turn = run(main(1))
    assert one_turn[0] == [0, 1]
    assert sorted(x for batch in one_turn for x in batch) == [0, 1, 2, 3]


def test_a_lone_request_runs_alone_only_where_execute_would_run_it_at_once(run: Any, poll: Any) -> None:
    """``alone_now`` (the express lane's question): an idle instance, nothing queued, and no
    reason to wait for companions; ``take_alone`` counts the arrival as ``execute`` does."""

    def alone(b: Batcher) -> bool:
        if not b.alone_now():
            return False
        b.give_back(b.take_alone(time.perf_counter()), time.perf_counter())
        return True

    async def body() -> None:
        runner = Recorder(work_s=0.05)
        b = await started(policy(max_queue_delay_s=0.01, preferred_batch_sizes=(4,)), runner)
        assert alone(b)
        running = asyncio.ensure_future(b.execute(item(1), None))
        await busy(runner, poll)
        assert not b.alone_now()  # the one instance is busy
        queued = asyncio.ensure_future(b.execute(item(2), None))
        await asyncio.sleep(0)
        assert not b.alone_now()  # and a request is queued
        await asyncio.gather(running, queued)
        # arrivals that overlapped others: the batcher may wait for companions, the lane steps aside
        for _ in range(4):
            await asyncio.gather(*(b.execute(item(i), None) for i in range(4)))
        assert not b.alone_now()
        # a sequential client again: the lane comes back
        runner.work_s = 0.0
        for i in range(20):
            await b.execute(item(i), None)
        assert alone(b)
        # with gathering on, one request in 16 looks for companions on the road
        b.gather_ready = True
        assert [alone(b) for _ in range(16)].count(False) == 1
        await b.close()

    run(body())
