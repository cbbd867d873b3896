"""Embeddings on the request road: what the OpenAI ``/v1/embeddings`` route calls.

An embedding model is a pipeline whose steps end in a ``pooling`` step (tokenizer → encoder
→ pooling, ``pipeline/pooling.py``), so its requests walk the same road as any model's:
deadline, validation, response cache, the pipeline's batcher (requests share runs of the
steps), the encoder's own batcher and statistics. ``embedding_spec`` reads from its config
which tensors carry the texts, the token ids and the vectors; ``Embedder`` turns a list of
texts (or of token-id lists) into requests of at most ``max_batch_size`` rows, so that
2048 inputs are 64 batches of 32, never one giant tensor, and puts the rows back together.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.config.model_config import ModelConfig
from milliserve.errors import InvalidInputError, RequestError
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from milliserve.road import gather_parts

__all__ = ["Embedder", "EmbeddingSpec", "Embeddings", "embedding_spec"]

Infer = Callable[[InferRequest], Awaitable[InferResponse]]


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    """Which tensors of an embedding pipeline carry what."""

    text: str  # the BYTES input [batch, 1]
    ids: str | None  # the token ids a request may send in place of text (an optional input)
    mask: str | None
    output: str  # FP32 [batch, dim]
    tokens: str | None  # INT64 [batch, 1]: tokens per text (None: not an output)
    max_batch_size: int
    dimensions: tuple[int, ...]  # the smaller sizes a request may ask for
    # the int8 scale of compact embeddings (runtime/embedding_types.py); None: no int8
    int8_scale: float | None = None


def embedding_spec(config: ModelConfig) -> EmbeddingSpec | None:
    """The spec of ``config`` when it is an embedding model: a pipeline with a tokenizer that
    reads a declared BYTES input, and a pooling step whose output it declares. None otherwise."""
    if config.ensemble_scheduling is None or config.max_batch_size < 1:
        return None
    steps = config.ensemble_scheduling.step
    inputs = {t.name: t for t in config.input}
    outputs = {t.name for t in config.output}
    tok = next((s.tokenizer for s in steps if s.tokenizer is not None), None)
    pooling = next((s.pooling for s in reversed(steps) if s.pooling is not None), None)
    if tok is None or pooling is None or pooling.output not in outputs:
        return None
    text = inputs.get(tok.text_input)
    if text is None or text.data_type != "BYTES":
        return None
    ids = inputs.get(tok.ids)
    takes_ids = ids is not None and ids.optional and text.optional
    mask = tok.mask if takes_ids and tok.mask and tok.mask in inputs else None
    return EmbeddingSpec(
        text=tok.text_input,
        ids=tok.ids if takes_ids else None,
        mask=mask,
        output=pooling.output,
        tokens=pooling.tokens if pooling.tokens in outputs else None,
        max_batch_size=config.max_batch_size,
        dimensions=pooling.dimensions,
        int8_scale=pooling.int8_scale or (1.0 if pooling.normalize else None),
    )


@dataclass(slots=True)
class Embeddings:
    vectors: np.ndarray[Any, Any]  # FP32 [inputs, dim], in the order of the inputs
    tokens: int  # tokens embedded (after any truncation), special tokens included
    # the model's answers, one per part of the inputs: their stage timings
    responses: list[InferResponse]


class Embedder:
    """Embeds inputs with one embedding model, through ``infer`` (the data plane's)."""

    def __init__(self, name: str, version: str, spec: EmbeddingSpec, infer: Infer) -> None:
        self.name, self.version, self.spec, self._infer = name, version, spec, infer

    def _request(
        self, rows: Sequence[str] | Sequence[Sequence[int]], token_ids: bool, parameters: dict[str, Any]
    ) -> InferRequest:
        spec = self.spec
        if token_ids:
            assert spec.ids is not None
            width = max(len(r) for r in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for i, r in enumerate(rows):
                ids[i, : len(r)] = np.asarray(r, dtype=np.int64)
                mask[i, : len(r)] = 1
            inputs = [InferTensor(spec.ids, "INT64", ids.shape, ids)]
            if spec.mask is not None:
                inputs.append(InferTensor(spec.mask, "INT64", mask.shape, mask))
        else:
            data = np.empty((len(rows), 1), dtype=object)
            data[:, 0] = [str(r).encode() for r in rows]
            inputs = [InferTensor(spec.text, "BYTES", data.shape, data)]
        wanted = [RequestedOutput(spec.output)] + ([RequestedOutput(spec.tokens)] if spec.tokens else [])
        return InferRequest(self.name, self.version, inputs, outputs=wanted, parameters=parameters)

    async def _part(
        self, rows: Sequence[Any], start: int, token_ids: bool, parameters: dict[str, Any]
    ) -> tuple[np.ndarray[Any, Any], int, InferResponse]:
        try:
            response = await self._infer(self._request(rows, token_ids, parameters))
        except RequestError as exc:
            if start == 0 and len(rows) == 1:
                raise
            # the road's messages count elements within this part of the inputs
            where = f"inputs {start}..{start + len(rows) - 1}"
            raise type(exc)(f"{where}: {exc.message}", *exc.args[1:]) from None
        by_name = {t.name: t.data for t in response.outputs}
        tokens = int(np.asarray(by_name[self.spec.tokens]).sum()) if self.spec.tokens else 0
        return np.asarray(by_name[self.spec.output], dtype=np.float32), tokens, response

    async def embed(
        self, inputs: Sequence[str] | Sequence[Sequence[int]], dimensions: int | None = None
    ) -> Embeddings:
        """One vector per input (texts, or lists of token ids), in order. Raises
        InvalidInputError for token ids when the model takes text only, and what the road
        raises (a text too long, ``dimensions`` the model does not allow, a full queue...)."""
        if not inputs:
            raise InvalidInputError("no input to embed", "input")
        token_ids = not isinstance(inputs[0], str)
        if token_ids and self.spec.ids is None:
            raise InvalidInputError(
                f"model {self.name!r} takes text only: its pipeline does not declare the token ids "
                "as an optional input",
                "input",
            )
        parameters: dict[str, Any] = {} if dimensions is None else {"dimensions": dimensions}
        n = self.spec.max_batch_size
        parts = [(inputs[i : i + n], i) for i in range(0, len(inputs), n)]
        if len(parts) == 1:
            vectors, tokens, response = await self._part(inputs, 0, token_ids, parameters)
            return Embeddings(vectors, tokens, [response])
        # the parts queue together: they join other requests' batches and, on a model with
        # several instances, run at once; one that fails cancels the others
        done = await gather_parts([self._part(rows, i, token_ids, parameters) for rows, i in parts])
        vectors = np.concatenate([v for v, _, _ in done])
        return Embeddings(vectors, sum(t for _, t, _ in done), [r for _, _, r in done])
