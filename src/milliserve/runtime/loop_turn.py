"""The express lane under load: the requests of one event-loop turn run as one batch.

``ModelRuntime.infer_soon`` adds a request that overlaps others to this turn's batch
(``LoopTurn.join``) instead of sending it down the road; the batch runs inline on an idle
instance once the loop has read every socket that was ready (``call_soon``), and each
request's answer reaches its connection through its ``done`` callback (runtime/soon.py).
The turn belongs to one model version's ``BatchExecute``: it runs batches with its
``execute_batch``, records them with its ``account``, and queues in its batcher when the
road took the instance in between. docs/design.md, "The express lane under load".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from milliserve.backends.base import Backend
from milliserve.errors import BackendError, InvalidInputError
from milliserve.runtime.adaptive import AdaptiveBatching
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.queued_request import QueuedRequest
from milliserve.runtime.validation import Signature

__all__ = ["LoopTurn", "TurnDone", "TurnHost", "TurnItem"]

log = logging.getLogger(__name__)
Arrays = dict[str, np.ndarray[Any, Any]]

# what a turn's request gets: its outputs (or the exception in their place), and when its batch started
TurnDone = Callable[["Arrays | BaseException", float], None]


@dataclass(slots=True)
class TurnItem:
    """A request in a loop turn's batch (``LoopTurn.join``)."""

    inputs: Arrays
    batch_size: int
    signature: Signature
    work: int  # input elements
    done: TurnDone
    deadline: float | None = None  # perf_counter() by which the answer must be out
    flow: Hashable = None  # the client connection, for the batcher's fairness if it queues
    arrived: float = 0.0


def _answer(item: TurnItem, value: Arrays | BaseException, started: float, label: str) -> None:
    try:
        item.done(value, started)
    except Exception:  # a bug in one request's answer: the others are answered
        log.exception("%s: unexpected error answering a request of a turn's batch", label)


def _settle_from_road(
    queued: QueuedRequest, item: TurnItem, label: str, future: asyncio.Future[Arrays]
) -> None:
    started = queued.dispatched or time.perf_counter()
    if future.cancelled():
        _answer(item, asyncio.CancelledError(), started, label)
        return
    exc = future.exception()
    _answer(item, exc if exc is not None else future.result(), started, label)


class TurnHost(Protocol):
    """What a loop turn runs on: a model version's ``BatchExecute`` (runtime/batch_execute.py)."""

    label: str
    policy: BatchPolicy
    batcher: Batcher
    backends: list[Backend]
    adaptive: AdaptiveBatching | None
    wrapped: bool  # a stall injector (tests) wraps the road's batches: no turns then
    inline_mode: str
    inline_below_s: float
    inline_per_work: float | None

    def execute_batch(
        self, backend: Backend, batch: Sequence[QueuedRequest] | Sequence[TurnItem]
    ) -> tuple[list[Arrays], int, int, int]: ...

    def account(
        self,
        started: float,
        work: int,
        items: int,
        queue_ns: list[int],
        inline: bool,
        in_ns: int,
        infer_ns: int,
        out_ns: int,
    ) -> None: ...


class LoopTurn:
    """The requests of this loop turn of one model version that run as one batch at its end."""

    def __init__(self, execute: TurnHost) -> None:
        self._execute = execute
        self._requests: list[TurnItem] = []
        self._work = 0
        self._items = 0
        self._signature: Signature | None = None
        self._scheduled = False
        # seconds per input element of a turn's batch, learnt from the turns run (a batch
        # costs less per element than a request alone: the model's fixed cost is shared)
        self.per_work: float | None = None

    @property
    def forming(self) -> bool:
        """Whether a turn's batch holds requests not yet run."""
        return bool(self._requests)

    def possible(self, work: int) -> bool:
        """Whether a request of ``work`` input elements may join a loop turn's batch
        (``join``): the batcher merges and is idle (``Batcher.turn_open``), and the
        request alone would run inline, by the lower of the turns' estimate and the inline
        one (which every run feeds: a turn estimate pushed up by a busy spell comes back
        down once the turns run again)."""
        if self._execute.wrapped or not self._execute.batcher.turn_open():
            return False
        if self._execute.inline_mode == "true":
            return True
        turn, inline = self.per_work, self._execute.inline_per_work
        if turn is None or inline is None:
            return False
        return min(turn, inline) * work < self._execute.inline_below_s

    def join(self, item: TurnItem) -> None:
        """Add a request that ``possible`` let in to this loop turn's batch, which runs
        inline once the loop has read every socket that was ready (``call_soon``): the
        requests that came in one turn share one run of the model, without the road's tasks,
        futures and queue. Its ``done`` gets its outputs (or the exception in their place)
        and the time the batch started. A batch that this request would make too large
        (over the batcher's ``max_batch_size``, as budget-driven batching sets it, or its
        compute, estimated from the turns run so far, over ``inline_below_s``), or of
        another shape, runs now, and this request starts the next."""
        turn = self._requests
        if turn:
            per_work = self.per_work
            if (
                item.signature != self._signature
                or self._items + item.batch_size > self._execute.batcher.policy.max_batch_size
                or (
                    self._execute.inline_mode != "true"
                    and per_work is not None
                    and per_work * (self._work + item.work) >= self._execute.inline_below_s
                )
            ):
                self.flush()
                turn = self._requests
        if not turn:
            self._signature = item.signature
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._run)
        item.arrived = now = time.perf_counter()
        self._execute.batcher.arrived_in_turn(now, bool(turn))
        turn.append(item)
        self._work += item.work
        self._items += item.batch_size

    def _run(self) -> None:
        self._scheduled = False
        if self._requests:
            self.flush()

    def flush(self) -> None:
        turn, work, items = self._requests, self._work, self._items
        self._requests, self._work, self._items = [], 0, 0
        self._execute.batcher.left_turn(len(turn))
        started = time.perf_counter()
        index = self._execute.batcher.take_turn()
        if index is None:  # the road took the instance in between: the turn queues there
            self._to_road(turn)
            return
        answers: list[tuple[TurnItem, Arrays | BaseException, float]] = []
        try:
            self._run_on(index, turn, work, items, started, answers)
        finally:
            self._execute.batcher.give_back(index, started)
        for it, value, at in answers:  # once the instance is back: an answer may start more work
            _answer(it, value, at, self._execute.label)

    def _run_on(
        self,
        index: int,
        turn: list[TurnItem],
        work: int,
        items: int,
        started: float,
        answers: list[tuple[TurnItem, Arrays | BaseException, float]],
    ) -> None:
        """Run ``turn``'s batch on the instance ``index``, with an answer in ``answers`` for
        each of its requests whatever happens: a model error in a batch of several reruns
        them one by one there (isolation: only the culprit fails), a bug answers each with an
        internal error."""
        try:
            per_item, in_ns, infer_ns, out_ns = self._execute.execute_batch(
                self._execute.backends[index], turn
            )
        except (BackendError, InvalidInputError) as exc:
            if len(turn) > 1:
                for it in turn:
                    self._run_on(index, [it], it.work, it.batch_size, time.perf_counter(), answers)
                return
            if isinstance(exc, BackendError):  # client data errors are the client's to see, not logs'
                log.warning("%s: %s", self._execute.label, exc)
            answers.append((turn[0], exc, started))
            return
        except Exception as exc:  # a bug, not a model failure: still answer every request
            log.exception("%s: unexpected error running a batch", self._execute.label)
            err = BackendError(f"internal error running model {self._execute.label!r}: {exc}")
            answers.extend((it, err, started) for it in turn)
            return
        try:
            queue_ns = [int((started - it.arrived) * 1e9) for it in turn]
            self._execute.account(started, work, items, queue_ns, True, in_ns, infer_ns, out_ns)
            per_work = self.per_work
            if (
                per_work is not None
            ):  # as ``BatchExecute._learn``: a preempted run counts at most twice the estimate
                seen = min(infer_ns / 1e9 / max(work, 1), 2 * per_work)
                self.per_work = per_work + 0.1 * (seen - per_work)
            if self._execute.adaptive is not None:
                for it in turn:
                    self._execute.adaptive.observe(started - it.arrived, infer_ns / 1e9)
        except Exception:  # a bug in the bookkeeping: the answers still go out
            log.exception("%s: unexpected error recording a turn's batch", self._execute.label)
        answers.extend((it, outs, started) for it, outs in zip(turn, per_item, strict=True))

    def _to_road(self, turn: list[TurnItem]) -> None:
        """A turn's requests queued in the batcher (with their deadlines and clients; their
        arrivals were counted when they joined the turn), each answered as it comes."""
        loop = asyncio.get_running_loop()
        timeout_s = self._execute.policy.timeout_s(None)
        for it in turn:
            future: asyncio.Future[Arrays] = loop.create_future()
            queued = QueuedRequest(it.inputs, it.batch_size, it.signature, future, enqueued=it.arrived)
            queued.deadline = it.deadline
            queued.flow = it.flow
            try:
                self._execute.batcher.submit(queued, timeout_s, counted=True)
            except Exception as exc:
                _answer(it, exc, time.perf_counter(), self._execute.label)
                continue
            future.add_done_callback(functools.partial(_settle_from_road, queued, it, self._execute.label))
