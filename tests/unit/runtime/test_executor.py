"""Worker threads: results, errors, cancellation safety, and CPU placement."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from milliserve.runtime.executor import Executor
from milliserve.testing import InProcessServer


def test_worker_returns_results_and_raises_errors(run: Any) -> None:
    async def main() -> None:
        w = Executor(cpu_affinity=False).worker("t")
        assert await w.run(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ZeroDivisionError):
            await w.run(lambda: 1 / 0)
        w.close()

    run(main())


def test_cancelled_caller_still_waits_for_the_thread(run: Any) -> None:
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.1)
        finished.set()

    async def main() -> None:
        w = Executor(cpu_affinity=False).worker("t")
        task = asyncio.create_task(w.run(slow))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished.is_set()  # the instance was not released while its call still ran
        w.close()

    run(main())


def test_microsecond_models_share_the_loop_cpu_and_slow_ones_do_not(
    tmp_path: Path, write_add_sub: Callable[..., Path], write_slow: Callable[..., Path], run: Any
) -> None:
    write_add_sub(
        tmp_path,
        config='name: "add_sub"\nparameters { key: "intra_op_thread_count" value: { string_value: "1" } }',
    )
    write_slow(tmp_path)
    before = os.sched_getaffinity(0)

    async def main() -> None:
        async with InProcessServer(tmp_path, listen=False) as server:
            loop_cpu = server.executor.loop_cpu
            assert loop_cpu is not None, "these machines have 2 CPUs; placement needs at least two"
            assert os.sched_getaffinity(0) == {loop_cpu}
            assert server.registry.get("add_sub").colocated
            assert not server.registry.get("slow").colocated
        assert os.sched_getaffinity(0) == before  # the caller's thread gets its CPUs back

    run(main())
