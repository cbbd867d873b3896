"""A confidence cascade: a fast model answers the rows it is sure of, a full model the rest.

    - cascade: {fast: sentiment_fast, full: sentiment_model, escalate_below: 0.8,
                probabilities: probabilities, answered_by: answered_by}

``fast`` runs on the whole batch. A row whose top probability (its largest value of the
output ``probabilities``) is under ``escalate_below`` is escalated: those rows go to
``full`` in one request, and its answers replace the fast model's for them. Both models
take the same inputs and give the same outputs (checked at load), mapped to the
pipeline's tensors with ``input_map`` / ``output_map`` as for a model step. The optional
BYTES output ``answered_by`` [batch, 1] names the model that answered each row; the
response parameter ``answered_by`` names it too (both, comma-separated, for a mixed
batch). Each model's stages land in Server-Timing as a model step's do, and the
pipeline's metrics count the rows answered fast and the rows escalated, per step.

When the full model would miss the request's deadline (it refuses before computing), the
escalated rows keep the fast model's answers: ``answered_by`` says so, the response
parameter ``escalation_skipped`` is ``deadline``, and the rows are counted as
``cascade_escalations_skipped``. An answer marked as the fast model's beats a 429 for a
request that already has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from milliserve.config.step_config import Cascade, PipelineStep
from milliserve.errors import BackendError, ConfigError, DeadlineUnmeetableError
from milliserve.pipeline.hedge import same_io
from milliserve.pipeline.steps import ModelCall, tensor
from milliserve.protocol.types import InferTensor
from milliserve.road import Call, Tensors

__all__ = ["CascadeStep", "escalated_rows", "merge_rows"]

Array = np.ndarray[Any, Any]


def escalated_rows(probabilities: Array, below: float) -> Array:
    """Indices of the rows whose top probability is under ``below`` (compared in the
    probabilities' own precision, so float32(0.8) is not under a threshold of 0.8)."""
    p = np.asarray(probabilities)
    if p.ndim == 0 or p.shape[0] == 0:
        return np.zeros(0, dtype=np.intp)
    top = p.reshape(p.shape[0], -1).max(axis=1)
    bound = np.asarray(below, dtype=top.dtype) if top.dtype.kind == "f" else below
    return np.flatnonzero(top < bound)


def merge_rows(fast: Array, full: Array, rows: Array) -> Array:
    """``fast`` with its ``rows`` replaced, in order, by the rows of ``full``."""
    if fast.shape[1:] != full.shape[1:] or len(rows) != full.shape[0]:
        raise ValueError(
            f"cannot put {full.shape[0]} rows of shape {list(full.shape[1:])} into rows "
            f"{rows.tolist()} of a batch shaped {list(fast.shape)}"
        )
    out = fast.copy()
    out[rows] = full
    return out


class CascadeStep:
    """The cascade step (see the module docstring)."""

    def __init__(
        self,
        name: str,
        step: PipelineStep,
        get: Callable[[str, str], Any],
    ) -> None:
        assert step.cascade is not None
        c: Cascade = step.cascade
        self.name, self.stage, self.cascade = name, "", c
        fast, full = get(c.fast, ""), get(c.full, "")
        try:
            same_io({c.fast: fast, c.full: full})
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc.message}") from None
        if fast.config.max_batch_size <= 0 or full.config.max_batch_size <= 0:
            raise ConfigError(
                f"{name}: a cascade splits batches by row, so {c.fast!r} and {c.full!r} need "
                "max_batch_size > 0"
            )
        inputs = [n for n, _, _ in fast.client_inputs()]
        outputs = [t.name for t in fast.config.output]
        if c.probabilities not in outputs:
            raise ConfigError(
                f"{name}: cascade.probabilities {c.probabilities!r} is not an output of {c.fast!r} "
                f"(outputs: {outputs})"
            )
        also = (c.probabilities,)
        self.fast = ModelCall(name, step, inputs, outputs, get, model=c.fast, also=also)
        self.full = ModelCall(name, step, inputs, outputs, get, model=c.full, also=also)
        self.needs = self.fast.needs
        self.makes = self.fast.makes + ((c.answered_by,) if c.answered_by else ())
        if c.answered_by in self.fast.makes:
            raise ConfigError(f"{name}: cascade.answered_by {c.answered_by!r} is also a model output")
        self._names = np.array([c.fast.encode(), c.full.encode()], dtype=object)
        self.counts = {"cascade_fast_rows": 0, "cascade_escalated_rows": 0, "cascade_escalations_skipped": 0}

    async def run(self, tensors: Tensors, call: Call) -> None:
        c = self.cascade
        first = await self.fast.infer(self.fast.request(tensors, call))
        self.fast.absorb(first, call)
        answers = {t.name: t for t in first.outputs}
        rows = escalated_rows(answers[c.probabilities].data, c.escalate_below)
        batch = int(np.asarray(answers[c.probabilities].data).shape[0])
        second = None
        if len(rows):
            try:
                second = await self.full.infer(self.full.request(tensors, call, rows=rows))
            except DeadlineUnmeetableError:
                # the full model cannot answer in time: the fast answer, said to be one, beats
                # a 429 for a request the fast model has already answered
                call.notes["escalation_skipped"] = "deadline"
                self.counts["cascade_escalations_skipped"] += len(rows)
                rows = rows[:0]
        if second is not None:
            self.full.absorb(second, call)
            for t in second.outputs:
                mine = answers[t.name]
                try:
                    data = merge_rows(np.asarray(mine.data), np.asarray(t.data), rows)
                except ValueError as exc:
                    raise BackendError(f"{self.name}: output {t.name!r}: {exc}") from None
                answers[t.name] = InferTensor(t.name, t.datatype, tuple(data.shape), data)
        self.fast.write(list(answers.values()), tensors)
        escalated = np.zeros(batch, dtype=np.intp)
        escalated[rows] = 1
        if c.answered_by:
            tensors[c.answered_by] = tensor(c.answered_by, self._names[escalated][:, None])
        self.counts["cascade_fast_rows"] += batch - len(rows)
        self.counts["cascade_escalated_rows"] += len(rows)
        by = [c.fast] if len(rows) < batch else []
        call.notes["answered_by"] = ",".join(by + ([c.full] if len(rows) else [])) or c.fast
