"""The only place in milliserve that owns threads.

Inference and model loading are blocking; they run here, off the event loop.
Two pools keep a slow model load from delaying inference: ``infer`` (one thread
per model instance is enough, threads start lazily) and ``load``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["Executor"]

P = ParamSpec("P")
T = TypeVar("T")


class Executor:
    """Runs blocking callables in worker threads and awaits them from asyncio."""

    def __init__(self, max_infer_threads: int = 64, max_load_threads: int = 2) -> None:
        self._infer = ThreadPoolExecutor(max_infer_threads, thread_name_prefix="ms-infer")
        self._load = ThreadPoolExecutor(max_load_threads, thread_name_prefix="ms-load")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run an inference-path callable in a worker thread."""
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs) if kwargs else functools.partial(fn, *args)
        return await loop.run_in_executor(self._infer, call)

    async def run_load(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a model-loading callable (slow, rare) in the load pool, keeping context vars."""
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._load, call)

    def shutdown(self) -> None:
        self._infer.shutdown(wait=True, cancel_futures=True)
        self._load.shutdown(wait=True, cancel_futures=True)
