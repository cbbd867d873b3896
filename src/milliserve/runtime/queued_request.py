"""What a model's queue holds (``QueuedRequest``: a validated request, its deadline, its
client), what runs a batch of them (``Runner``), and the order in which the clients' requests
take turns (``round_robin``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.runtime.validation import Signature

__all__ = ["QueuedRequest", "Runner", "round_robin"]


@dataclass(slots=True, eq=False, repr=False)
class QueuedRequest:
    """A validated request waiting for an instance. Compared by identity, and its repr names
    its tensors' shapes without their values: ``deque.remove`` formats a missing item's repr
    into its ValueError, and numpy's formatting of one small tensor costs ~0.5 ms, so 4,000
    cancelled requests held the event loop for 2 s (issue 24, item 5)."""

    inputs: dict[str, np.ndarray[Any, Any]]
    batch_size: int
    signature: Signature
    future: asyncio.Future[dict[str, np.ndarray[Any, Any]]]
    priority: int = 0
    enqueued: float = field(default_factory=time.perf_counter)
    expired: bool = False
    dispatched: float = 0.0
    deadline: float | None = None  # perf_counter() by which the answer must be out
    timer: asyncio.TimerHandle | None = None
    # the client connection it came on (InferRequest.client), for fairness; None: unknown
    flow: Hashable = None

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {list(v.shape)}" for k, v in self.inputs.items())
        return f"QueuedRequest({{{shapes}}}, batch_size={self.batch_size}, priority={self.priority})"


Runner = Callable[[list[QueuedRequest], int], Awaitable[None]]


def round_robin(items: list[QueuedRequest]) -> list[QueuedRequest]:
    """``items`` (in arrival order) with the flows taking turns: every flow's first request
    in arrival order, then every flow's second, and so on."""
    if len(items) < 2:
        return items
    seen: dict[Hashable, int] = {}
    rounds: list[list[QueuedRequest]] = []
    for it in items:
        n = seen.get(it.flow, 0)
        seen[it.flow] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(it)
    if len(seen) == 1:  # one flow: its own order
        return items
    return [it for r in rounds for it in r]
