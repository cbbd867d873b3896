"""``POST /v1/classify`` (and ``/classify``, infinity's shape) and ``POST /predict`` (TEI's):
texts labelled by a sequence-classification pipeline (``runtime/scoring.py``), every label
with its score, best first.

- infinity's: ``model``, ``input`` (a string or a list of strings), ``raw_scores``, and
  ``top_k`` (the k best labels per text; all by default). The answer is ``{"object":
  "classify", "id", "created", "model", "data": [[{"label", "score"}, ...], ...], "usage"}``.
- TEI's ``/predict``: ``inputs`` (a string, or a list of ``[string]`` for a batch),
  ``raw_scores``, ``truncate``, ``truncation_direction``. The answer is ``[{"label",
  "score"}, ...]`` for one string, a list of such lists for a batch. Pairs of texts
  (``[string, string]``) need a pair classifier and are refused. ``model`` may be left out
  when the server has one classifier, as TEI has.

Labels come from the model's config (its ``rules`` step's ``labels``). ``raw_scores`` true
skips a ``score`` step's activation; a model that applies its softmax in its graph (the
sentiment example) answers the same either way.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.runtime.dataplane import DataPlane
from milliserve.server.http.json_route import Answer, JsonRoute, ReadBody, bad

__all__ = ["MAX_INPUTS", "ClassifyRequest", "ClassifyRoute", "parse_classify", "parse_predict"]

MAX_INPUTS = 2048
_INFINITY = ("model", "input", "raw_scores", "top_k", "user")
_TEI = ("model", "inputs", "raw_scores", "truncate", "truncation_direction")


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    model: str | None
    texts: list[str]
    raw_scores: bool
    top_k: int | None
    tei: bool
    single: bool  # TEI: one string in, one list of labels out


def _flag(doc: dict[str, Any], name: str) -> bool:
    v = doc.get(name, False)
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _model(doc: dict[str, Any]) -> str | None:
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise bad(f"'model' must be the name of a classifier, got {model!r}", "model")
    return model


def _unknown(doc: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise bad(f"unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])


def _count(texts: list[Any], field: str) -> None:
    if not texts:
        raise bad(f"'{field}' is an empty list; give at least one text to classify", field)
    if len(texts) > MAX_INPUTS:
        raise bad(f"'{field}' has {len(texts)} texts; at most {MAX_INPUTS} go in one request", field)


def parse_classify(doc: dict[str, Any]) -> ClassifyRequest:
    """infinity's request, checked; InvalidInputError (400) naming the field."""
    _unknown(doc, _INFINITY)
    raw = doc.get("input")
    if raw is None:
        raise bad("'input' is required: a string or a list of strings", "input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list):
        raise bad(f"'input' must be a string or a list of strings, got {type(raw).__name__}", "input")
    _count(texts, "input")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise bad(f"'input' item {i} is {type(t).__name__}; give strings", "input")
    top_k = doc.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise bad(f"'top_k' must be a positive integer, got {top_k!r}", "top_k")
    return ClassifyRequest(_model(doc), texts, _flag(doc, "raw_scores"), top_k, False, False)


def parse_predict(doc: dict[str, Any]) -> ClassifyRequest:
    """TEI's ``/predict`` request, checked; InvalidInputError (400) naming the field."""
    _unknown(doc, _TEI)
    raw = doc.get("inputs")
    if raw is None:
        raise bad("'inputs' is required: a string, or a batch [[string], ...]", "inputs")
    direction = doc.get("truncation_direction", "right")
    if not isinstance(direction, str) or direction.lower() != "right":
        raise bad(
            f"'truncation_direction' is {direction!r}; texts are cut on the right only",
            "truncation_direction",
        )
    _flag(doc, "truncate")  # the model's config decides: texts over its length are cut
    pair = "a pair of texts needs a pair classifier; this route's models classify single texts"
    if isinstance(raw, str):
        return ClassifyRequest(_model(doc), [raw], _flag(doc, "raw_scores"), None, True, True)
    if not isinstance(raw, list):
        raise bad(f"'inputs' must be a string or a batch [[string], ...], got {type(raw).__name__}", "inputs")
    _count(raw, "inputs")
    if all(isinstance(t, str) for t in raw):
        raise bad(f"'inputs' is a list of {len(raw)} strings, which TEI reads as a pair: {pair}", "inputs")
    texts = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, list) and len(item) == 1 and isinstance(item[0], str):
            texts.append(item[0])
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(t, str) for t in item):
            raise bad(f"'inputs' item {i} is a pair: {pair}", "inputs")
        else:
            raise bad(f"'inputs' item {i} must be a string or [string], got {item!r:.60}", "inputs")
    return ClassifyRequest(_model(doc), texts, _flag(doc, "raw_scores"), None, True, False)


def _ranked(row: list[float], labels: tuple[str, ...], top_k: int | None) -> list[dict[str, Any]]:
    order = sorted(range(len(row)), key=lambda j: -row[j])[:top_k]
    return [{"label": labels[j], "score": row[j]} for j in order]


def classify_answer(
    request: ClassifyRequest, model: str, labels: tuple[str, ...], scores: np.ndarray[Any, Any], tokens: int
) -> Any:
    rows = [_ranked(r, labels, request.top_k) for r in scores.tolist()]
    if request.tei:
        return rows[0] if request.single else rows
    return {
        "object": "classify",
        "id": f"classify-{uuid.uuid4().hex}",
        "created": int(time.time()),  # wall clock: a timestamp, as infinity's
        "model": model,
        "data": rows,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class ClassifyRoute(JsonRoute):
    """``POST /v1/classify``, ``/classify`` and ``/predict`` for one HttpApp."""

    def __init__(self, dataplane: DataPlane, read_body: ReadBody) -> None:
        super().__init__(read_body)
        self.dp = dataplane

    def tei_shaped(self, path: list[str], doc: dict[str, Any]) -> bool:
        return path == ["predict"]

    async def answer(self, doc: dict[str, Any], tei: bool) -> Answer:
        request = parse_predict(doc) if tei else parse_classify(doc)
        model = request.model or self.dp.only_model("classify")
        classifier = self.dp.classifier(model)
        scores = await classifier.classify(request.texts, request.raw_scores)
        labels = classifier.spec.labels
        return Answer(classify_answer(request, model, labels, scores.values, scores.tokens), scores.responses)
