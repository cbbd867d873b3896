"""Events from the engine thread to the event loop, one wake-up for many.

``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe on every call: a
system call on the engine thread between a step's samples, and a loop iteration (an
``epoll_wait`` and a pipe read) for every event. At 8 streams that was 8 of each per step.
An ``Outbox`` queues events and wakes the loop only when it is not already due to drain:
the engine thread holds the GIL while it samples a step, so every event of the step is
delivered by one wake-up, taken when the step's ``llama_decode`` lets the loop run."""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Any

__all__ = ["Outbox", "outbox_of"]


class Outbox:
    """``put`` from any thread; delivery with ``put_nowait`` on the loop's thread, in order."""

    __slots__ = ("__weakref__", "_due", "_items", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[asyncio.Queue[Any], Any]] = deque()
        self._due = False  # a drain is scheduled and has not started

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        self._items.append((queue, item))
        if not self._due:
            self._due = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        # cleared before the queue is read: an item put after this line either is read
        # below or schedules the next drain, never neither
        self._due = False
        items = self._items
        while items:
            queue, item = items.popleft()
            queue.put_nowait(item)


_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = weakref.WeakKeyDictionary()


def outbox_of(loop: asyncio.AbstractEventLoop) -> Outbox:
    """The loop's outbox (one per loop, made on first use; called on the loop's thread)."""
    box = _OUTBOXES.get(loop)
    if box is None:
        box = _OUTBOXES[loop] = Outbox(loop)
    return box
