"""The only place in milliserve that owns threads.

Inference and model loading are blocking; they run here, off the event loop.

- Each model instance gets a dedicated worker thread (``Executor.worker``): one
  batch at a time per instance, and the cheapest hand-off CPython offers (a
  SimpleQueue in, ``call_soon_threadsafe`` out), which matters when the model
  itself runs in microseconds.
- Model loading and warmup run in a small separate pool, so a slow load never
  delays inference.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

__all__ = ["Executor", "InstanceWorker"]

P = ParamSpec("P")
T = TypeVar("T")


def _resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # the waiter was cancelled
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class InstanceWorker:
    """A thread that runs one model instance's calls, one at a time."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name=f"ms-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, fut = job
            loop = fut.get_loop()
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_resolve, fut, False, exc)
            else:
                loop.call_soon_threadsafe(_resolve, fut, True, result)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on this instance's thread and await its result.

        If the awaiting task is cancelled (a client went away), this still waits for
        the call to finish before re-raising: a thread cannot be interrupted, and the
        instance must not start another call meanwhile.
        """
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put((functools.partial(fn, *args, **kwargs), fut))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await fut
            raise

    def close(self) -> None:
        """Let the thread finish its queued calls and exit."""
        self._jobs.put(None)


class Executor:
    """Creates instance workers and runs model loading off the event loop."""

    def __init__(self, max_load_threads: int = 2) -> None:
        self._load = ThreadPoolExecutor(max_load_threads, thread_name_prefix="ms-load")

    def worker(self, name: str) -> InstanceWorker:
        """A dedicated thread for one model instance; its owner closes it on unload."""
        return InstanceWorker(name)

    async def run_load(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a model-loading callable (slow, rare) in the load pool, keeping context vars."""
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._load, call)

    def shutdown(self) -> None:
        self._load.shutdown(wait=True, cancel_futures=True)
