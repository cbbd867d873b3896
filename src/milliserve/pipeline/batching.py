"""Requests to a pipeline share one run of its steps.

A pipeline's own steps are Python: a feature lookup, a join, the rules each cost microseconds
per call, as much as a small model's whole compute. Run once per request they held the fraud
pipeline to about half of fraud_mlp's capacity, although the model batched underneath (issue
23). Run once per batch, their cost is shared the way a model's is.

So a pipeline's requests queue in a work-conserving batcher (``runtime/batcher.py``) in front
of its steps, as a model's do in front of its instances: a lone request runs at once, and
requests that arrive while ``slots`` batches are running leave together. One slot by
default: the steps run on the event loop, and a second batch in flight only splits the
requests into smaller batches (measured: 2 slots cost the fraud pipeline a fifth of its
throughput). A pipeline gets as many slots as its widest model step has instances, so that
every instance can be busy. An idle slot with concurrent clients first yields the loop for
up to ``GATHER_TURNS`` turns while they bring more of the burst. The batch's rows go
through the steps as one request (a ``BatchCall``), and each request gets its own rows back,
its own notes (features defaulted for its own rows) and the batch's stage times.

A pipeline batches when it has a batch dimension (``max_batch_size`` > 0) and every step is
row-wise (``rowwise``: features read per row, python, model, rules, ann). Tokenizers (they pad
a batch to its longest text) count as row-wise only when what they padded is made one row
per text again before it is a pipeline output: by a ``pooling`` step (an embedding
pipeline), or by a model that reads the tokenizer's attention mask and whose outputs have no
token axis (a classifier: the mask is there so that padding does not change a row's answer).
Such a batch runs once, padded to its longest text, where one run per text could not merge
texts of different lengths in the model's batcher (measured: MiniLM on 2 threads, 4 texts of
32 tokens in 11.9 ms against 5.1 ms each alone). A dynamically quantized model computes its
activation scales over the whole batch, padded positions included, so a row's score moves
with its batch mates (the int8 MiniLM: up to 0.14, docs/design.md), as it does when the
model's own batcher merges requests. Cascades and hedges keep one run per request. Config
``parameters { key: "pipeline_batching" value: { string_value: "false" } }`` turns it off.
Requests merge only with equal non-batch shapes and equal request parameters.

A batch that fails is rerun request by request, so a bad request, or a deadline too tight
for the others, costs only its sender.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from milliserve.errors import BackendError, ConfigError, DeadlineUnmeetableError, MilliserveError
from milliserve.features.tokenize import TokenizerStep
from milliserve.protocol.types import InferRequest, InferTensor
from milliserve.road import BatchCall, Call, Outputs, SpanLog, Step
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher
from milliserve.runtime.queued_request import QueuedRequest
from milliserve.runtime.validation import Signature

__all__ = ["BatchedSteps", "batching_wanted"]

_MODES = ("auto", "false")

# Turns of the event loop an idle slot waits for companions while they keep coming
# (``Batcher._gather``): a batch's steps cost a fixed ~100 µs of Python, far more than a
# turn, so it pays to gather the rest of a burst; a model keeps one turn. The measurements
# are in docs/design.md ("Microsecond models run on the event loop").
GATHER_TURNS = 3


def batching_wanted(
    parameters: dict[str, str], max_batch_size: int, steps: Sequence[Step], outputs: Sequence[str] = ()
) -> bool:
    """Whether a pipeline's requests may share runs of its steps (see the module docstring)."""
    mode = parameters.get("pipeline_batching", "auto").lower()
    if mode not in _MODES:
        raise ConfigError(f"parameter 'pipeline_batching' must be one of {_MODES}, got {mode!r}")
    return mode == "auto" and max_batch_size > 0 and _rowwise(steps, outputs)


def _rowwise(steps: Sequence[Step], outputs: Sequence[str]) -> bool:
    """Every step row-wise, where a tokenizer counts as one when what it padded (its ids and
    what steps make from them, such as token embeddings) is unpadded before it reaches a
    pipeline output: pooled rows do not depend on the padding of the batch, nor do the rows
    of a model that reads the tokenizer's attention mask and answers without a token axis
    (a classifier's probabilities)."""
    padded: set[str] = set()
    masks: set[str] = set()
    for step in steps:
        if isinstance(step, TokenizerStep):
            padded.update(step.makes)
            if step.mask:
                masks.add(step.mask)
        elif not getattr(step, "rowwise", False):
            return False
        elif padded.intersection(step.needs) and not _unpads(step, masks):
            padded.update(step.makes)
    return not padded.intersection(outputs)


def _unpads(step: Step, masks: set[str]) -> bool:
    """Whether ``step``'s outputs are free of the padding of what it reads."""
    if getattr(step, "unpads", False):
        return True
    masked = getattr(step, "masks_padding", None)
    return masked is not None and any(masked(mask) for mask in masks)


@dataclass(slots=True, eq=False)
class _Member(QueuedRequest):
    """A queued pipeline request: its call, and its outputs once its batch ran (the future
    only says when)."""

    call: Call | None = None
    outputs: Outputs | None = None


def _hashable(parameters: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """The request parameters as part of a batch signature; None when they cannot be one."""
    key = tuple(sorted(parameters.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _fail(items: list[_Member], exc: BaseException) -> None:
    """Hand ``exc`` to the requests still waiting; re-raise it unless it is an Exception (a
    cancellation of the run itself goes on up)."""
    for it in items:
        if not it.future.done():
            it.future.set_exception(exc)
    if not isinstance(exc, Exception):
        raise exc


class BatchedSteps:
    """The terminal of a batching pipeline's road: batches requests, then runs ``steps``."""

    def __init__(
        self, label: str, steps: Callable[[Call], Awaitable[Outputs]], max_batch_size: int, slots: int = 1
    ) -> None:
        self.steps = steps
        policy = BatchPolicy(label, merge=True, max_batch_size=max_batch_size)
        self.batcher = Batcher(policy, self._run, slots)
        # let requests the server has already read join an idle slot's batch, and those it
        # reads in the next turns of the loop while they keep coming (see GATHER_TURNS)
        self.batcher.gather_ready = True
        self.batcher.gather_turns = GATHER_TURNS

    async def start(self) -> None:
        await self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close(drain=True)

    async def __call__(self, call: Call) -> Outputs:
        params = call.request.parameters
        key = _hashable(params) if params else ()
        if key is None:  # parameters that cannot be compared: this request runs alone
            return await self.steps(call)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # requests merge when their shapes and their parameters are equal
        signature = cast(Signature, (call.signature, key))
        item = _Member({t.name: t.data for t in call.request.inputs}, call.batch_size, signature, future)
        item.call, item.deadline = call, call.deadline
        await self.batcher.execute(item, None)
        outputs = item.outputs
        assert outputs is not None
        waited = item.dispatched - item.enqueued
        if waited > 0:
            call.stages["queue"] = call.stages.get("queue", 0.0) + waited
            if call.request.trace is not None:
                call.request.trace.add("queue", item.enqueued, item.dispatched)
        return outputs

    async def _run(self, batch: list[QueuedRequest], index: int) -> None:
        members = [it for it in batch if isinstance(it, _Member) and it.call is not None]
        while len(members) > 1:
            whole = self._joined(members)
            try:
                outputs = await self.steps(whole)
                self._split(members, whole, outputs)
            except DeadlineUnmeetableError as exc:
                # the batch carries its earliest deadline: the members that hold it are
                # refused (as each would be at the model's door), the others run on together
                late = [it for it in members if it.deadline is not None and it.deadline == whole.deadline]
                if not late or len(late) == len(members):
                    await self._each_alone(members)
                    return
                _fail(late, exc)
                members = [it for it in members if it not in late]
                continue
            except MilliserveError:
                # one request's data may fail the batch: each alone, so only its sender sees
                # the error
                await self._each_alone(members)
                return
            except BaseException as exc:
                _fail(members, exc)
                return
            for it in members:  # the batch's step spans, in each traced member's trace
                log = it.call.request.trace if it.call is not None else None
                if log is not None:
                    log.absorb(whole.request.trace)
            return
        if members:
            await self._alone(members[0])

    async def _each_alone(self, members: list[_Member]) -> None:
        for it in members:
            await self._alone(it)

    async def _alone(self, item: _Member) -> None:
        assert item.call is not None
        try:
            outputs = await self.steps(item.call)
        except BaseException as exc:
            _fail([item], exc)
            return
        item.outputs = outputs
        if not item.future.done():
            item.future.set_result({})

    @staticmethod
    def _joined(members: list[_Member]) -> BatchCall:
        calls = [it.call for it in members if it.call is not None]
        first = calls[0].request
        inputs = []
        for t in first.inputs:
            data = np.concatenate([it.inputs[t.name] for it in members])
            inputs.append(InferTensor(t.name, t.datatype, tuple(data.shape), data))
        deadlines = [c.deadline for c in calls if c.deadline is not None]
        traced = any(c.request.trace is not None for c in calls)
        request = InferRequest(
            first.model_name,
            first.model_version,
            inputs,
            id=first.id,
            parameters=first.parameters,
            trace=SpanLog() if traced else None,
        )
        parts = tuple(c.batch_size for c in calls)
        return BatchCall(
            request,
            deadline=min(deadlines) if deadlines else None,
            batch_size=sum(parts),
            signature=calls[0].signature,
            parts=parts,
            part_notes=[{} for _ in calls],
        )

    @staticmethod
    def _split(members: list[_Member], whole: BatchCall, outputs: Outputs) -> None:
        rows = whole.batch_size
        for t in outputs:
            if not t.shape or t.shape[0] != rows:
                raise BackendError(
                    f"pipeline output {t.name!r} has shape {list(t.shape)}, not a row per input row "
                    f"({rows}): a pipeline with max_batch_size > 0 makes batch-major outputs"
                )
        by_name = {t.name: (t.datatype, t.shape[1:], np.asarray(t.data)) for t in outputs}
        every = list(by_name)
        for it, notes, (start, end) in zip(members, whole.part_notes, whole.spans(), strict=True):
            call = it.call
            assert call is not None
            wanted = [o.name for o in call.request.outputs] if call.request.outputs else every
            mine = []
            for name in wanted:
                datatype, inner, data = by_name[name]
                mine.append(InferTensor(name, datatype, (end - start, *inner), data[start:end]))
            stages = call.stages
            for k, v in whole.stages.items():
                stages[k] = stages.get(k, 0.0) + v
            call.notes.update(whole.notes)
            call.notes.update(notes)
            it.outputs = mine
            if not it.future.done():
                it.future.set_result({})
