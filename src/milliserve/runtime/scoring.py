"""Rerank and classify on the request road: what ``/v1/rerank`` and ``/v1/classify`` call.

A reranker is a pipeline of a pair tokenizer (``tokenizer.pair_input``: each row a query
and a document), a cross-encoder model and a ``score`` step (sigmoid or raw); a classifier
is a pipeline of a tokenizer, a sequence-classification model and a ``rules`` step whose
``labels`` name the columns of a scores tensor the pipeline returns. Their requests walk
the same road as any model's: deadline, validation, response cache, the pipeline's batcher,
length buckets at the model, its own batcher and statistics.

``rerank_spec`` and ``classify_spec`` read from a config which tensors carry what;
``Reranker`` and ``Classifier`` turn a list of documents (texts) into requests of at most
``max_batch_size`` rows that queue together, so that 1,000 documents are 32 batches of 32,
never one giant tensor, and put the rows back together in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.config.model_config import ModelConfig
from milliserve.errors import BackendError, InvalidInputError, RequestError
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from milliserve.road import gather_parts

__all__ = [
    "Classifier",
    "ClassifySpec",
    "RerankSpec",
    "Reranker",
    "Scores",
    "classify_spec",
    "rerank_spec",
]

Infer = Callable[[InferRequest], Awaitable[InferResponse]]


@dataclass(frozen=True, slots=True)
class RerankSpec:
    """Which tensors of a reranking pipeline carry what."""

    query: str  # BYTES [batch, 1]
    document: str  # BYTES [batch, 1]
    score: str  # FP32 [batch, 1]
    tokens: str | None  # INT64 [batch, 1] (None: not an output)
    max_batch_size: int


@dataclass(frozen=True, slots=True)
class ClassifySpec:
    """Which tensors of a classifying pipeline carry what."""

    text: str  # BYTES [batch, 1]
    scores: str  # FP32 [batch, len(labels)]
    labels: tuple[str, ...]
    tokens: str | None
    max_batch_size: int


def _bytes_inputs(config: ModelConfig) -> set[str]:
    return {t.name for t in config.input if t.data_type == "BYTES"}


def rerank_spec(config: ModelConfig) -> RerankSpec | None:
    """The spec of ``config`` when it is a reranker: a pipeline whose tokenizer reads pairs of
    declared BYTES inputs, and a score step whose output it declares. None otherwise."""
    if config.ensemble_scheduling is None or config.max_batch_size < 1:
        return None
    steps = config.ensemble_scheduling.step
    tok = next((s.tokenizer for s in steps if s.tokenizer is not None), None)
    score = next((s.score for s in reversed(steps) if s.score is not None), None)
    outputs = {t.name for t in config.output}
    if tok is None or tok.pair_input is None or score is None or score.output not in outputs:
        return None
    if not {tok.text_input, tok.pair_input} <= _bytes_inputs(config):
        return None
    tokens = score.tokens if score.tokens in outputs else None
    return RerankSpec(tok.text_input, tok.pair_input, score.output, tokens, config.max_batch_size)


def classify_spec(config: ModelConfig) -> ClassifySpec | None:
    """The spec of ``config`` when it is a classifier: a pipeline whose tokenizer reads one
    declared BYTES input and whose ``rules`` step names labels for the columns of a tensor
    the pipeline declares as an output. None otherwise."""
    if config.ensemble_scheduling is None or config.max_batch_size < 1:
        return None
    steps = config.ensemble_scheduling.step
    tok = next((s.tokenizer for s in steps if s.tokenizer is not None), None)
    rules = next((s.rules for s in steps if s.rules is not None and s.rules.labels), None)
    outputs = {t.name: t for t in config.output}
    if (
        tok is None
        or tok.pair_input is not None
        or rules is None
        or tok.text_input not in _bytes_inputs(config)
    ):
        return None
    scores = outputs.get(rules.input)
    if scores is None or scores.data_type != "FP32":
        return None
    score = next((s.score for s in steps if s.score is not None), None)
    tokens = score.tokens if score is not None and score.tokens in outputs else None
    return ClassifySpec(tok.text_input, rules.input, rules.labels, tokens, config.max_batch_size)


@dataclass(slots=True)
class Scores:
    values: np.ndarray[Any, Any]  # FP32 [inputs, n], in the order of the inputs
    tokens: int  # tokens scored (after any truncation), special tokens included
    # the model's answers, one per part of the inputs: their stage timings
    responses: list[InferResponse]


def _texts(name: str, rows: Sequence[str]) -> InferTensor:
    data = np.empty((len(rows), 1), dtype=object)
    data[:, 0] = [r.encode() for r in rows]
    return InferTensor(name, "BYTES", data.shape, data)


MakeInputs = Callable[[int, int], list[InferTensor]]


class _Parts:
    """Rows of one request sent as parts of at most ``max_batch_size`` that queue together."""

    def __init__(
        self, name: str, version: str, infer: Infer, output: str, tokens: str | None, rows: int
    ) -> None:
        self.name, self.version, self._infer = name, version, infer
        self._output, self._tokens, self._max = output, tokens, rows

    async def _part(
        self, inputs: MakeInputs, start: int, stop: int, what: str, parameters: dict[str, Any]
    ) -> tuple[Any, int, InferResponse]:
        wanted = [RequestedOutput(self._output)] + ([RequestedOutput(self._tokens)] if self._tokens else [])
        request = InferRequest(
            self.name, self.version, inputs(start, stop), outputs=wanted, parameters=parameters
        )
        try:
            response = await self._infer(request)
        except RequestError as exc:
            if start == 0 and stop - start == 1:
                raise
            # the road's messages count elements within this part of the inputs
            raise type(exc)(f"{what} {start}..{stop - 1}: {exc.message}", *exc.args[1:]) from None
        by_name = {t.name: t.data for t in response.outputs}
        tokens = int(np.asarray(by_name[self._tokens]).sum()) if self._tokens else 0
        values = np.asarray(by_name[self._output], dtype=np.float32).reshape(stop - start, -1)
        return values, tokens, response

    async def _run(self, count: int, inputs: MakeInputs, what: str, raw_scores: bool) -> Scores:
        parameters: dict[str, Any] = {"raw_scores": True} if raw_scores else {}
        n = self._max
        parts = [self._part(inputs, i, min(i + n, count), what, parameters) for i in range(0, count, n)]
        # the parts queue together: they join other requests' batches and, on a model with
        # several instances, run at once; one that fails cancels the others
        done = await gather_parts(parts) if len(parts) > 1 else [await parts[0]]
        values = np.concatenate([v for v, _, _ in done])
        return Scores(values, sum(t for _, t, _ in done), [r for _, _, r in done])


class Reranker(_Parts):
    """Scores documents against a query with one reranking model, through ``infer``."""

    def __init__(self, name: str, version: str, spec: RerankSpec, infer: Infer) -> None:
        super().__init__(name, version, infer, spec.score, spec.tokens, spec.max_batch_size)
        self.spec = spec

    async def rerank(self, query: str, documents: Sequence[str], raw_scores: bool = False) -> Scores:
        """One relevance score per document (``values`` [n, 1]), in order. Raises
        InvalidInputError for no documents, and what the road raises (a text refused, a
        full queue, a deadline...)."""
        if not documents:
            raise InvalidInputError("no documents to rerank", "documents")
        spec = self.spec

        def inputs(start: int, stop: int) -> list[InferTensor]:
            return [
                _texts(spec.query, [query] * (stop - start)),
                _texts(spec.document, documents[start:stop]),
            ]

        return await self._run(len(documents), inputs, "documents", raw_scores)


class Classifier(_Parts):
    """Labels texts with one classifying model, through ``infer``."""

    def __init__(self, name: str, version: str, spec: ClassifySpec, infer: Infer) -> None:
        super().__init__(name, version, infer, spec.scores, spec.tokens, spec.max_batch_size)
        self.spec = spec

    async def classify(self, texts: Sequence[str], raw_scores: bool = False) -> Scores:
        """One score per label and text (``values`` [n, len(labels)]), in order. Raises
        InvalidInputError for no texts, BackendError when the model's scores do not match
        its labels, and what the road raises."""
        if not texts:
            raise InvalidInputError("no input to classify", "input")
        spec = self.spec

        def inputs(start: int, stop: int) -> list[InferTensor]:
            return [_texts(spec.text, texts[start:stop])]

        scores = await self._run(len(texts), inputs, "inputs", raw_scores)
        if scores.values.shape[1] != len(spec.labels):
            raise BackendError(
                f"model {self.name!r} returned {scores.values.shape[1]} scores per text for the "
                f"{len(spec.labels)} labels its config names ({list(spec.labels)})"
            )
        return scores
