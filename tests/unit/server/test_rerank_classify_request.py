"""Requests of /v1/rerank, /rerank (TEI) and /v1/classify, /predict (TEI), checked before
anything runs, and the answers' order and shapes (server/http/rerank.py, classify.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from milliserve.errors import InvalidInputError
from milliserve.server.http.classify import classify_answer, parse_classify, parse_predict
from milliserve.server.http.rerank import MAX_DOCUMENTS, parse_rerank, rerank_answer


def test_cohere_shape_with_strings_and_objects() -> None:
    r = parse_rerank(
        {
            "model": "m",
            "query": "q",
            "documents": ["a", {"text": "b", "id": 7}],
            "top_n": 1,
            "return_documents": True,
        }
    )
    assert not r.tei and r.texts == ["a", "b"] and r.top_n == 1
    doc = rerank_answer(r, "m", np.array([[0.2], [0.9]], dtype=np.float32), 12)
    assert [x["index"] for x in doc["results"]] == [1]
    assert doc["results"][0]["document"] == {"text": "b", "id": 7}
    assert doc["results"][0]["relevance_score"] == pytest.approx(0.9)
    assert doc["usage"] == {"prompt_tokens": 12, "total_tokens": 12} and doc["model"] == "m"


def test_tei_shape_answers_tei_list_best_first_ties_in_order() -> None:
    r = parse_rerank({"query": "q", "texts": ["a", "b", "c"], "return_text": True, "raw_scores": True})
    assert r.tei and r.raw_scores and r.model is None
    out = rerank_answer(r, "m", np.array([0.5, 0.7, 0.5], dtype=np.float32), 0)
    assert out == [
        {"index": 1, "score": pytest.approx(0.7), "text": "b"},
        {"index": 0, "score": 0.5, "text": "a"},
        {"index": 2, "score": 0.5, "text": "c"},
    ]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "m", "query": "q", "documents": []}, "documents", "empty list"),
        ({"model": "m", "query": "q", "documents": ["d"] * (MAX_DOCUMENTS + 1)}, "documents", "at most 1000"),
        ({"model": "m", "query": "", "documents": ["d"]}, "query", "non-empty"),
        ({"model": "m", "documents": ["d"]}, "query", "missing"),
        ({"model": "m", "query": "q"}, "documents", "required"),
        ({"model": "m", "query": "q", "documents": [3]}, "documents", "item 0 is int"),
        ({"model": "m", "query": "q", "documents": [{"title": "x"}]}, "documents", "'text'"),
        ({"model": "m", "query": "q", "documents": ["d"], "top_n": 0}, "top_n", "positive"),
        (
            {"model": "m", "query": "q", "documents": ["d"], "rank_fields": ["x"]},
            "rank_fields",
            "rank_fields",
        ),
        ({"query": "q", "texts": [], "truncate": True}, "texts", "empty list"),
        ({"query": "q", "texts": ["d"], "truncation_direction": "Left"}, "truncation_direction", "right"),
        ({"query": "q", "texts": ["d"], "return_text": "yes"}, "return_text", "true or false"),
    ],
)
def test_refused_with_a_reason(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidInputError, match=words) as info:
        parse_rerank(body)
    assert info.value.args[1] == param


def test_classify_infinity_shape_sorted_and_top_k() -> None:
    r = parse_classify({"model": "s", "input": ["good", "bad"], "top_k": 1})
    doc = classify_answer(r, "s", ("negative", "positive"), np.array([[0.1, 0.9], [0.8, 0.2]]), 5)
    assert doc["object"] == "classify" and doc["model"] == "s"
    assert doc["data"] == [[{"label": "positive", "score": 0.9}], [{"label": "negative", "score": 0.8}]]
    one = parse_classify({"model": "s", "input": "good", "raw_scores": True})
    assert one.texts == ["good"] and one.raw_scores and one.top_k is None


def test_predict_tei_shapes() -> None:
    single = parse_predict({"inputs": "good"})
    labels = ("negative", "positive")
    assert classify_answer(single, "s", labels, np.array([[0.3, 0.7]]), 0) == [
        {"label": "positive", "score": 0.7},
        {"label": "negative", "score": 0.3},
    ]
    batch = parse_predict({"inputs": [["good"], ["bad"]]})
    assert batch.texts == ["good", "bad"] and not batch.single
    assert len(classify_answer(batch, "s", labels, np.array([[0.3, 0.7], [0.6, 0.4]]), 0)) == 2


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"inputs": ["a", "b"]}, "pair"),
        ({"inputs": [["a", "b"]]}, "item 0 is a pair"),
        ({"inputs": []}, "empty list"),
        ({"inputs": 3}, "got int"),
        ({"input": "x"}, "unrecognized request argument supplied: input"),
    ],
)
def test_predict_refused(body: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInputError, match=words):
        parse_predict(body)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": "s"}, "required"),
        ({"model": "s", "input": []}, "empty list"),
        ({"model": "s", "input": ["a", 1]}, "item 1 is int"),
        ({"model": "s", "input": "a", "top_k": -1}, "positive"),
    ],
)
def test_classify_refused(body: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInputError, match=words):
        parse_classify(body)
