"""The only place in milliserve that owns threads.

Inference and model loading are blocking; they run here, off the event loop.

- Each model instance gets a dedicated worker thread (``Executor.worker``): one
  batch at a time per instance, and the cheapest hand-off CPython offers (a
  SimpleQueue in, ``call_soon_threadsafe`` out), which matters when the model
  itself runs in microseconds.
- Model loading and warmup run in a small separate pool, so a slow load never
  delays inference; request work too heavy for the event loop (a large JSON body,
  long texts to tokenize) runs in a third pool (``offload``).
- CPU affinity (Linux, ``cpu_affinity: auto``): the event loop thread keeps to one
  CPU, and the worker of a model that runs in microseconds on one thread keeps to
  the same CPU. Waking a thread on another vCPU costs tens of microseconds on a
  VM, more than such a model's whole run; on the same CPU the hand-off is a plain
  context switch. Every other thread milliserve starts may use all CPUs. The
  loop still never runs inference itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
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


def _set_affinity(cpus: set[int] | None) -> None:
    """Restrict the calling thread to ``cpus`` (no-op when None or unsupported)."""
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


class InstanceWorker:
    """A thread that runs one model instance's calls, one at a time."""

    def __init__(self, name: str, cpus: set[int] | None = None) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self.cpus = cpus
        self._thread = threading.Thread(target=self._loop, name=f"ms-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        _set_affinity(self.cpus)
        while (job := self._jobs.get()) is not None:
            call, fut = job
            loop = fut.get_loop()
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_resolve, fut, False, exc)
            else:
                loop.call_soon_threadsafe(_resolve, fut, True, result)
            # not held while this thread waits for the next job: the call's inputs may be
            # views of a shared-memory region its client has unregistered since
            job = call = fut = result = None  # type: ignore[assignment]

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

    def __init__(self, max_load_threads: int = 2, cpu_affinity: bool = True, worker_index: int = 0) -> None:
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        # Affinity is worth managing only when there is a choice of CPUs.
        self._all_cpus: set[int] | None = allowed if cpu_affinity and len(allowed) > 1 else None
        # the workers of `serve --workers N` put their loops on different CPUs
        self.loop_cpu: int | None = sorted(allowed)[worker_index % len(allowed)] if self._all_cpus else None
        self._load = ThreadPoolExecutor(
            max_load_threads,
            thread_name_prefix="ms-load",
            initializer=_set_affinity,
            initargs=(self._all_cpus,),
        )
        # request work too large for the event loop (big JSON bodies, long texts): a pool of
        # its own, so it never waits behind a model load
        self._cpu = ThreadPoolExecutor(
            max(1, min(4, len(allowed) or 1)),
            thread_name_prefix="ms-cpu",
            initializer=_set_affinity,
            initargs=(self._all_cpus,),
        )

    def pin_event_loop(self) -> None:
        """Keep the calling (event loop) thread on ``loop_cpu``. Call from the loop."""
        if self.loop_cpu is not None:
            _set_affinity({self.loop_cpu})

    def unpin_event_loop(self) -> None:
        """Give the calling thread every CPU back (the loop may belong to a larger program)."""
        _set_affinity(self._all_cpus)

    def worker(self, name: str, colocate: bool = False) -> InstanceWorker:
        """A dedicated thread for one model instance; its owner closes it on unload.

        ``colocate`` keeps it on the event loop's CPU; otherwise it may use every CPU
        (set explicitly, since a thread inherits the affinity of the one that starts it).
        """
        cpus = {self.loop_cpu} if colocate and self.loop_cpu is not None else self._all_cpus
        return InstanceWorker(name, cpus)

    def thread(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """A long-lived thread (not started) that may use every CPU, such as a generation
        engine's loop: set explicitly, since a thread started from the pinned event loop
        would inherit its single CPU (and so would llama.cpp's compute threads)."""
        cpus = self._all_cpus

        def run() -> None:
            _set_affinity(cpus)
            target()

        return threading.Thread(target=run, name=name, daemon=True)

    async def run_load(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a model-loading callable (slow, rare) in the load pool, keeping context vars."""
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._load, call)

    async def offload(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a request's CPU-heavy step (decode a large body, tokenize long texts) off the
        event loop, so that it delays only the request it belongs to."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._cpu, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self._load.shutdown(wait=True, cancel_futures=True)
        self._cpu.shutdown(wait=True, cancel_futures=True)
