"""Where a batch runs: inline on the event loop, or on the instance's worker thread."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from milliserve.backends.base import BackendInfo
from milliserve.protocol.types import InferRequest, InferTensor, TensorSpec
from milliserve.road import Call
from milliserve.runtime.batch_execute import BatchExecute
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.deadline import LatencyEstimator
from milliserve.runtime.executor import Executor
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import ModelIO

SPEC_IN = TensorSpec("x", "FP32", (4,))
SPEC_OUT = TensorSpec("y", "FP32", (4,))


class Doubler:
    """A microsecond model; ``stall_s`` makes its next run that slow (a preempted run)."""

    def __init__(self) -> None:
        self.stall_s = 0.0

    def info(self) -> BackendInfo:
        return BackendInfo((SPEC_IN,), (SPEC_OUT,), "test")

    def run(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        if self.stall_s:
            time.sleep(self.stall_s)
            self.stall_s = 0.0
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def _call() -> Call:
    x = np.ones((1, 4), np.float32)
    call = Call(InferRequest("m", "1", [InferTensor("x", "FP32", (1, 4), x)]))
    call.signature = (("x", (4,)),)
    return call


def test_a_preempted_run_does_not_send_a_microsecond_model_to_the_worker_for_good() -> None:
    """One slow run (the thread lost its CPU for 20 ms on a busy machine) must not move
    every later batch of a 5 µs model to the worker thread: the estimate that decides it
    is also fed by the worker's runs, and a single spike moves it by a bounded step."""

    async def main() -> None:
        backend = Doubler()
        io = ModelIO("m", {"x": SPEC_IN}, {"y": SPEC_OUT}, max_batch_size=8)
        execute = BatchExecute(
            "m:1",
            BatchPolicy("m", merge=True, max_batch_size=8),
            [backend],
            io,
            ModelStats("m", "1"),
            LatencyEstimator(),
        )
        executor = Executor(cpu_affinity=False)
        await execute.start([executor.worker("m")], compute_s=5e-6, work=4, threads=1)
        try:
            assert (await execute(_call()))[0].data.tolist() == [[2.0] * 4]
            assert execute.inline_runs == 1
            backend.stall_s = 0.02
            await execute(_call())  # the slow one, inline
            for _ in range(50):
                await execute(_call())
            assert execute.inline_runs >= 45, execute.inline_runs
        finally:
            await execute.close()
            executor.shutdown()

    asyncio.run(main())
