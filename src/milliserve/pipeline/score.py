"""The ``score`` step: a model's raw scores made what clients get, in numpy on the whole
batch: a cross-encoder's relevance logit through a sigmoid (0..1), a classifier's logits
through a softmax, or left as they are.

With a pair tokenizer, a cross-encoder model and this step, a pipeline is a reranker
(``runtime/scoring.py``); a classifier's logits through a softmax step, labelled by a
``rules`` step, make a classifier. A request with the parameter ``raw_scores``
true gets the model's scores untouched (TEI's and infinity's ``raw_scores``).

Like pooling, it also counts each row's attended tokens (the usage of ``/v1/rerank``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milliserve.config.step_config import Score
from milliserve.errors import BackendError, InvalidInputError
from milliserve.pipeline.steps import tensor
from milliserve.road import Call, Tensors

__all__ = ["ScoreStep", "activate", "raw_scores"]

Array = np.ndarray[Any, Any]


def activate(x: Array, activation: str) -> Array:
    """``x`` (FP32) through ``activation``: sigmoid, softmax over the last axis, or none."""
    x = np.asarray(x, dtype=np.float32)
    if activation == "sigmoid":
        # exp of a negated large logit overflows to inf and gives 0, which is the answer
        with np.errstate(over="ignore"):
            out: Array = 1.0 / (1.0 + np.exp(-x))
        return out
    if activation == "softmax":
        z = np.exp(x - x.max(-1, keepdims=True))
        soft: Array = z / z.sum(-1, keepdims=True)
        return soft
    return x


def raw_scores(call: Call) -> bool:
    """Whether the request asks for the model's scores untouched (parameter ``raw_scores``)."""
    params = call.request.parameters
    asked = params.get("raw_scores") if params else None
    if asked is None:
        return False
    if not isinstance(asked, bool):
        raise InvalidInputError(f"parameter 'raw_scores' must be true or false, got {asked!r}")
    return asked


class ScoreStep:
    name: str
    stage = "postprocess"
    rowwise = True
    # its output has no token axis: one row per pair whatever the padding of the batch
    unpads = True

    def __init__(self, name: str, config: Score) -> None:
        self.name, self.config = name, config
        self.needs: tuple[str, ...] = (config.input, config.mask) if config.tokens else (config.input,)
        self.makes: tuple[str, ...] = (config.output,) + ((config.tokens,) if config.tokens else ())

    async def run(self, tensors: Tensors, call: Call) -> None:
        c = self.config
        x = np.asarray(tensors[c.input].data)
        if x.dtype.kind != "f" or x.ndim not in (1, 2):
            raise BackendError(
                f"{self.name}: {c.input!r} is {x.dtype} {list(x.shape)}; a score step needs float "
                "[batch] or [batch, n]"
            )
        scores = x.reshape(-1, 1) if x.ndim == 1 else x
        out = scores.astype(np.float32) if raw_scores(call) else activate(scores, c.activation)
        tensors[c.output] = tensor(c.output, np.ascontiguousarray(out, dtype=np.float32))
        if c.tokens:
            mask = np.asarray(tensors[c.mask].data)
            counts = np.count_nonzero(mask, axis=1).astype(np.int64)[:, None]
            tensors[c.tokens] = tensor(c.tokens, counts)
