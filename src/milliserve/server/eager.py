"""Run a request's coroutine at once, in the callback that completed the request, and make
a task only for what is left of it if it has to wait.

Why: a request to a microsecond model (a fraud score) can be answered without ever waiting
(its body is in, the model runs inline on the loop, the answer is written). As a task it
pays for the task, a turn of the event loop before it starts, and another before the
connection reads again: about as much as the model itself, on every request. Python 3.12's
``asyncio.eager_task_factory`` does this for every task; this is the same idea for the one
place that starts request coroutines, on the 3.11 this project supports.

How: ``coro.send(None)`` runs the coroutine up to its first suspension (or to its end). What
it yielded there (a future it waits on, or None for a bare yield) is handed to a task made
for ``Resume``, which relays every later value and exception between that task and the
coroutine exactly as the task would have with the coroutine itself, cancellation included.
The coroutine runs in a copy of the context, the same copy its task gets.

What does not hold before the first suspension: ``asyncio.current_task()`` is None (and
``asyncio.timeout`` refuses to run). On Python 3.12 and later the task is made eager by
asyncio itself (``eager_start``), where it does hold; on 3.11 only routes that need
neither are started this way (``eager_route``: not the generation routes, whose streams
bound their writes with ``asyncio.timeout``).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["Resume", "eager_route", "start_eager"]

_NATIVE = sys.version_info >= (3, 12)
# the generation routes (server/http/generate.py): OpenAI's and Triton's generate extension
_GENERATION_PREFIXES = ("/v1/chat", "/v1/completions", "/v1/responses")
_GENERATION_SUFFIXES = ("/generate", "/generate_stream")


def eager_route(scope: dict[str, Any]) -> bool:
    """Whether the request of ``scope`` may start eagerly (``start_eager``)."""
    if _NATIVE:
        return True
    path: str = scope["path"]
    return not (path.startswith(_GENERATION_PREFIXES) or path.endswith(_GENERATION_SUFFIXES))


_SENT = object()


class Resume(Coroutine[Any, Any, None]):
    """The rest of a coroutine that ran up to its first suspension, which yielded ``first``:
    a coroutine itself, which a task drives as it would have driven ``coro``. Its first
    ``send`` hands the task ``first``; a ``throw`` before that (the task cancelled before its
    first step: a client gone at once) cancels ``first``, as a task cancels the future it
    waits on, and throws into ``coro``, so that its ``finally`` and ``except`` run (a batcher
    gets back the instance it holds). A wrapper coroutine would be cancelled before it ever
    reached ``coro``, leaving it suspended for good."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self.coro, self.first = coro, first

    def send(self, value: Any) -> Any:
        first = self.first
        if first is not _SENT:
            self.first = _SENT
            return first
        return self.coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        first = self.first
        if first is not _SENT:
            self.first = _SENT
            if isinstance(first, asyncio.Future):
                first.cancel()
        if val is None and tb is None:
            return self.coro.throw(typ)
        return self.coro.throw(typ, val, tb)

    def close(self) -> None:
        self.first = _SENT
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, None]:
        return self

    def __iter__(self) -> Resume:
        return self

    def __next__(self) -> Any:
        return self.send(None)


def start_eager(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]
) -> asyncio.Task[None] | None:
    """Run ``coro`` now up to its first suspension: None when it finished, else the task
    that runs the rest. An exception it raises before suspending propagates."""
    if _NATIVE:
        task: asyncio.Task[None] = asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
        return None if task.done() else task
    context = contextvars.copy_context()
    try:
        first = context.run(coro.send, None)
    except StopIteration:
        return None
    return loop.create_task(Resume(coro, first), context=context)
