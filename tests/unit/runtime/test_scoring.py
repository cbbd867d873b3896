"""Rerank and classify on the road (runtime/scoring.py): which pipelines are rerankers or
classifiers, and that many documents go as parts of the model's batch size, in order, with
errors naming the part."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from milliserve.config.model_config import ModelConfig
from milliserve.errors import BackendError, InvalidInputError, RequestError
from milliserve.pipeline.steps import tensor
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.runtime.scoring import Classifier, Reranker, classify_spec, rerank_spec

RERANK: dict[str, Any] = {
    "name": "rr",
    "platform": "ensemble",
    "max_batch_size": 32,
    "input": [
        {"name": "QUERY", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "DOCUMENT", "data_type": "TYPE_STRING", "dims": [1]},
    ],
    "output": [
        {"name": "score", "data_type": "TYPE_FP32", "dims": [1]},
        {"name": "tokens", "data_type": "TYPE_INT64", "dims": [1]},
    ],
    "ensemble_scheduling": {
        "step": [
            {"tokenizer": {"file": "tokenizer.json", "text_input": "QUERY", "pair_input": "DOCUMENT"}},
            {"model_name": "cross"},
            {"score": {"input": "logits"}},
        ]
    },
}
CLASSIFY: dict[str, Any] = {
    "name": "clf",
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [
        {"name": "label", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [3]},
    ],
    "ensemble_scheduling": {
        "step": [
            {"tokenizer": {"file": "tokenizer.json"}},
            {"model_name": "m"},
            {"rules": {"input": "probabilities", "labels": ["a", "b", "c"], "output": "label"}},
        ]
    },
}


def _config(doc: dict[str, Any], **changes: Any) -> ModelConfig:
    return ModelConfig.model_validate({**doc, **changes})


def test_which_pipelines_are_rerankers_and_classifiers() -> None:
    spec = rerank_spec(_config(RERANK))
    assert spec is not None and (spec.query, spec.document, spec.score, spec.tokens) == (
        "QUERY",
        "DOCUMENT",
        "score",
        "tokens",
    )
    assert classify_spec(_config(RERANK)) is None
    # no pair: not a reranker; the score not an output: not one either
    single = {**RERANK["ensemble_scheduling"]["step"][0]["tokenizer"], "pair_input": None}
    steps = [{"tokenizer": single}, *RERANK["ensemble_scheduling"]["step"][1:]]
    assert rerank_spec(_config(RERANK, ensemble_scheduling={"step": steps})) is None
    assert rerank_spec(_config(RERANK, output=RERANK["output"][1:])) is None
    clf = classify_spec(_config(CLASSIFY))
    assert clf is not None and clf.labels == ("a", "b", "c") and clf.scores == "probabilities"
    assert clf.tokens is None and rerank_spec(_config(CLASSIFY)) is None
    assert classify_spec(_config(CLASSIFY, output=CLASSIFY["output"][:1])) is None  # scores not returned


def test_a_thousand_documents_go_in_parts_in_order() -> None:
    sizes: list[int] = []

    async def infer(request: InferRequest) -> InferResponse:
        docs = np.asarray(request.inputs[1].data).reshape(-1)
        queries = {bytes(q) for q in np.asarray(request.inputs[0].data).reshape(-1)}
        assert queries == {b"q"} and request.parameters == {"raw_scores": True}
        sizes.append(len(docs))
        score = np.array([[float(d.decode())] for d in docs], dtype=np.float32)
        tokens = np.full((len(docs), 1), 3, dtype=np.int64)
        return InferResponse("rr", "1", [tensor("score", score), tensor("tokens", tokens)])

    spec = rerank_spec(_config(RERANK))
    assert spec is not None
    docs = [str(i) for i in range(1000)]
    scores = asyncio.run(Reranker("rr", "", spec, infer).rerank("q", docs, raw_scores=True))
    assert sorted(sizes) == [8] + [32] * 31 and scores.tokens == 3000
    np.testing.assert_array_equal(scores.values[:, 0], np.arange(1000))
    assert len(scores.responses) == 32


def test_a_failing_part_is_named() -> None:
    async def infer(request: InferRequest) -> InferResponse:
        if b"40" in np.asarray(request.inputs[1].data).reshape(-1).tolist():
            raise InvalidInputError("input 'DOCUMENT' element 8 is not UTF-8 text")
        score = np.zeros((request.inputs[1].shape[0], 1), dtype=np.float32)
        return InferResponse("rr", "1", [tensor("score", score), tensor("tokens", score.astype(np.int64))])

    spec = rerank_spec(_config(RERANK))
    assert spec is not None
    with pytest.raises(RequestError, match=r"documents 32\.\.63: input 'DOCUMENT' element 8"):
        asyncio.run(Reranker("rr", "", spec, infer).rerank("q", [str(i) for i in range(100)]))
    with pytest.raises(InvalidInputError, match="no documents"):
        asyncio.run(Reranker("rr", "", spec, infer).rerank("q", []))


def test_classifier_checks_its_labels() -> None:
    async def infer(request: InferRequest) -> InferResponse:
        n = request.inputs[0].shape[0]
        return InferResponse("clf", "1", [tensor("probabilities", np.full((n, 2), 0.5, dtype=np.float32))])

    spec = classify_spec(_config(CLASSIFY))
    assert spec is not None
    with pytest.raises(BackendError, match="2 scores per text for the 3 labels"):
        asyncio.run(Classifier("clf", "", spec, infer).classify(["x"]))
