"""``POST /v1/rerank``, ``/v2/rerank`` (Cohere's v2 path) and ``/rerank``: a query and
documents scored by a cross-encoder (``runtime/scoring.py``), answered sorted by relevance.

Two request shapes, told apart by their fields:

- Cohere's (also Jina's, vLLM's, infinity's): ``model``, ``query``, ``documents`` (strings,
  or objects with a ``text``), ``top_n``, ``return_documents``, and infinity's ``raw_scores``.
  The answer is ``{"id", "model", "results": [{"index", "relevance_score", "document"?}],
  "usage"}``, results best first; ``document`` is the object sent, or ``{"text": ...}``.
- TEI's: ``query``, ``texts``, ``raw_scores``, ``return_text``, ``truncate``,
  ``truncation_direction``. The answer is TEI's list ``[{"index", "score", "text"?}]``,
  best first. ``model`` may be left out when the server has one reranker, as TEI has.

At most ``MAX_DOCUMENTS`` documents (Cohere's limit); they are split into the model's
batches and queue together. Any other field is a 400 naming it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.runtime.dataplane import DataPlane
from milliserve.server.http.json_route import Answer, JsonRoute, ReadBody, bad

__all__ = ["MAX_DOCUMENTS", "RerankRequest", "RerankRoute", "parse_rerank"]

MAX_DOCUMENTS = 1000
_COHERE = ("model", "query", "documents", "top_n", "return_documents", "raw_scores", "user")
_TEI = ("model", "query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction")


@dataclass(frozen=True, slots=True)
class RerankRequest:
    model: str | None
    query: str
    texts: list[str]
    documents: list[Any]  # what to return as each result's document (Cohere's shape)
    top_n: int | None
    return_documents: bool
    raw_scores: bool
    tei: bool


def _flag(doc: dict[str, Any], name: str) -> bool:
    v = doc.get(name, False)
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _documents(raw: Any, field: str) -> tuple[list[str], list[Any]]:
    if not isinstance(raw, list):
        raise bad(f"'{field}' must be a list of strings, got {type(raw).__name__}", field)
    if not raw:
        raise bad(f"'{field}' is an empty list; give at least one document to rank", field)
    if len(raw) > MAX_DOCUMENTS:
        raise bad(
            f"'{field}' has {len(raw)} documents; at most {MAX_DOCUMENTS} go in one request "
            "(send the rest in another)",
            field,
        )
    texts: list[str] = []
    shown: list[Any] = []
    for i, d in enumerate(raw):
        if isinstance(d, str):
            texts.append(d)
            shown.append({"text": d})
        elif field == "documents" and isinstance(d, dict) and isinstance(d.get("text"), str):
            texts.append(d["text"])
            shown.append(d)
        else:
            form = "a string or an object with a string 'text'" if field == "documents" else "a string"
            raise bad(f"'{field}' item {i} is {type(d).__name__}; each document is {form}", field)
    return texts, shown


def parse_rerank(doc: dict[str, Any]) -> RerankRequest:
    """The request in either shape, checked; InvalidInputError (400) naming the field."""
    tei = "texts" in doc and "documents" not in doc
    known = _TEI if tei else _COHERE
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise bad(f"unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise bad(f"'model' must be the name of a reranker, got {model!r}", "model")
    query = doc.get("query")
    if not isinstance(query, str) or not query.strip():
        what = "missing" if query is None else repr(query)
        raise bad(f"'query' must be a non-empty string, got {what}", "query")
    field = "texts" if tei else "documents"
    if field not in doc:
        raise bad(f"'{field}' is required: the documents to rank", field)
    texts, shown = _documents(doc[field], field)
    top_n = doc.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise bad(f"'top_n' must be a positive integer, got {top_n!r}", "top_n")
    if tei:
        direction = doc.get("truncation_direction", "right")
        if not isinstance(direction, str) or direction.lower() != "right":
            raise bad(
                f"'truncation_direction' is {direction!r}; documents are cut on the right only",
                "truncation_direction",
            )
        _flag(doc, "truncate")  # the model's config decides: documents over its length are cut
    returned = _flag(doc, "return_text" if tei else "return_documents")
    return RerankRequest(model, query, texts, shown, top_n, returned, _flag(doc, "raw_scores"), tei)


def rerank_answer(request: RerankRequest, model: str, scores: np.ndarray[Any, Any], tokens: int) -> Any:
    """The answer in the request's shape: documents best first (ties in input order)."""
    values = scores.reshape(-1)
    order = np.argsort(-values, kind="stable")
    if request.top_n is not None:
        order = order[: request.top_n]
    listed = values.tolist()
    if request.tei:
        out = []
        for i in order.tolist():
            item: dict[str, Any] = {"index": i, "score": listed[i]}
            if request.return_documents:
                item["text"] = request.texts[i]
            out.append(item)
        return out
    results = []
    for i in order.tolist():
        result: dict[str, Any] = {"index": i, "relevance_score": listed[i]}
        if request.return_documents:
            result["document"] = request.documents[i]
        results.append(result)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "object": "rerank",
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class RerankRoute(JsonRoute):
    """``POST /v1/rerank`` and ``/rerank`` for one HttpApp."""

    def __init__(self, dataplane: DataPlane, read_body: ReadBody) -> None:
        super().__init__(read_body)
        self.dp = dataplane

    def tei_shaped(self, path: list[str], doc: dict[str, Any]) -> bool:
        return "texts" in doc and "documents" not in doc

    async def answer(self, doc: dict[str, Any], tei: bool) -> Answer:
        request = parse_rerank(doc)
        model = request.model or self.dp.only_model("rerank")
        reranker = self.dp.reranker(model)
        scores = await reranker.rerank(request.query, request.texts, request.raw_scores)
        return Answer(rerank_answer(request, model, scores.values, scores.tokens), scores.responses)
