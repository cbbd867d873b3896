"""The ``pooling`` step: token embeddings to one vector per text (pooling, then L2
normalisation), as sentence-transformers' Pooling and Normalize modules do, in numpy on the
whole batch at once.

With this step after a tokenizer and an encoder, a pipeline is an embedding model: the
OpenAI ``/v1/embeddings`` route serves it (``runtime/embedding.py``). Its outputs no longer
depend on how the batch was padded, so requests to the pipeline share runs of its steps
(``pipeline/batching.py``), a batch of texts is tokenized in one call and the encoder sees
one batch.

A request may ask for a shorter vector with the parameter ``dimensions`` (an integer) when
the config lists that size (Matryoshka models): the pooled vector is cut to it and then
normalised, so that cosine similarities stay meaningful.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milliserve.config.step_config import Pooling
from milliserve.errors import BackendError, InvalidInputError
from milliserve.pipeline.steps import tensor
from milliserve.road import Call, Tensors

__all__ = ["PoolingStep", "pool"]

Array = np.ndarray[Any, Any]


def pool(hidden: Array, mask: Array, mode: str) -> Array:
    """One FP32 vector per row: ``hidden`` is [batch, seq, dim] (or [batch, dim] for mode
    ``none``), ``mask`` [batch, seq] with 1 on the tokens to pool over."""
    if mode == "none":
        return np.asarray(hidden, dtype=np.float32)
    m = np.asarray(mask) != 0
    rows = np.arange(hidden.shape[0])
    if mode == "cls":  # the first attended token (position 0 unless padded on the left)
        return np.asarray(hidden[rows, m.argmax(1)], dtype=np.float32)
    if mode == "last_token":  # the last attended token, whichever side the padding is on
        last = m.shape[1] - 1 - m[:, ::-1].argmax(1)
        return np.asarray(hidden[rows, last], dtype=np.float32)
    # mean over the attended tokens: one batched matrix product, [b, 1, s] @ [b, s, d]
    weights = m.astype(np.float32)
    summed = np.matmul(weights[:, None, :], hidden.astype(np.float32, copy=False))[:, 0, :]
    counts = np.maximum(weights.sum(1, keepdims=True), 1e-9)
    out: Array = summed / counts
    return out


def normalize(x: Array) -> Array:
    """Rows scaled to unit L2 norm (a zero row stays zero), as torch's ``F.normalize``."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]
    out: Array = x / np.maximum(norms, 1e-12)
    return out


class PoolingStep:
    name: str
    stage = "postprocess"
    # its outputs are one row per text whatever the padding of the batch: it undoes a
    # tokenizer's padding (pipeline/batching.py)
    rowwise = True
    unpads = True

    def __init__(self, name: str, config: Pooling) -> None:
        self.name, self.config = name, config
        self.needs: tuple[str, ...] = (config.input, config.mask)
        self.makes: tuple[str, ...] = (config.output,) + ((config.tokens,) if config.tokens else ())
        self.sizes = config.dimensions

    def _size(self, call: Call, width: int) -> int:
        """The vector size the request asks for (``dimensions``), checked; ``width`` if none."""
        params = call.request.parameters
        asked = params.get("dimensions") if params else None
        if asked is None or asked == width:
            return width
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
            raise InvalidInputError(f"parameter 'dimensions' must be a positive integer, got {asked!r}")
        if asked not in self.sizes:
            allowed = ", ".join(str(d) for d in (width, *self.sizes) if d <= width)
            why = "" if self.sizes else " (it cannot be shortened: its config lists no pooling.dimensions)"
            raise InvalidInputError(
                f"parameter 'dimensions' is {asked}, but this model's embeddings have {allowed} "
                f"dimensions{why}",
                "dimensions",
            )
        return asked

    async def run(self, tensors: Tensors, call: Call) -> None:
        c = self.config
        hidden = np.asarray(tensors[c.input].data)
        mask = np.asarray(tensors[c.mask].data)
        want_ndim = 2 if c.mode == "none" else 3
        if hidden.dtype.kind != "f" or hidden.ndim != want_ndim:
            raise BackendError(
                f"{self.name}: {c.input!r} is {hidden.dtype} {list(hidden.shape)}; pooling {c.mode!r} "
                f"needs float {'[batch, dim]' if want_ndim == 2 else '[batch, seq, dim]'}"
            )
        if (
            mask.ndim != 2
            or mask.shape[0] != hidden.shape[0]
            or (want_ndim == 3 and mask.shape != hidden.shape[:2])
        ):
            raise BackendError(
                f"{self.name}: mask {c.mask!r} has shape {list(mask.shape)}, which does not match "
                f"{c.input!r} {list(hidden.shape)}"
            )
        vectors = pool(hidden, mask, c.mode)
        size = self._size(call, vectors.shape[1])
        if size < vectors.shape[1]:
            vectors = np.ascontiguousarray(vectors[:, :size])
        if c.normalize:
            vectors = normalize(vectors)
        tensors[c.output] = tensor(c.output, vectors)
        if c.tokens:
            counts = np.count_nonzero(mask, axis=1).astype(np.int64)[:, None]
            tensors[c.tokens] = tensor(c.tokens, counts)
