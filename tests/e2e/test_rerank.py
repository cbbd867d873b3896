"""/v1/rerank and TEI's /rerank on the example cross-encoder (minilm_rerank: a pair
tokenizer -> minilm_cross -> sigmoid score step), through a real server. Every score is
checked against ONNX Runtime run directly on the same pairs, tokenized the same way
(issue 63, item 1)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from milliserve.examples.minilm_rerank import (
    LABEL_QUERIES,
    build_minilm_rerank,
    pair_feeds,
    write_peer_folder,
)
from milliserve.testing import ServerProcess

# the first setup trains the example cross-encoder (a few minutes on a busy 2-core machine)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

DOCS = [
    "self-driving cars are amazing, I can't wait to ride in one",
    "I will never trust a robot car with my life",
    "Google's driverless car drove me home today, what a great experience",
    "autonomous vehicles are a terrible idea and a waste of money",
    "",
    "Ünïcödé 🚗 and emoji in a tweet",
    "the future of transport looks bright with autonomous cars",
    "scary: another crash involving a self-driving test vehicle",
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("rerank")
    build_minilm_rerank(repo)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(repo) as proc:
        yield proc


@pytest.fixture(scope="module")
def session(repo: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(repo / "minilm_cross" / "1" / "model.onnx"), so)


def _logits(session: Any, query: str, docs: list[str]) -> np.ndarray[Any, Any]:
    """The cross-encoder's logits, ONNX Runtime run directly, 32 pairs at a time."""
    out = []
    for i in range(0, len(docs), 32):
        feeds = pair_feeds([query] * len(docs[i : i + 32]), docs[i : i + 32])
        out.append(session.run(["logits"], feeds)[0].reshape(-1))
    return np.concatenate(out)


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://{server.http_url}{path}", json=body, timeout=120)


def test_cohere_shape_scores_match_onnxruntime(server: ServerProcess, session: Any) -> None:
    documents: list[Any] = [*DOCS[:3], {"text": DOCS[3], "id": "d3"}, *DOCS[4:]]
    body = {"model": "minilm_rerank", "query": "positive", "documents": documents, "return_documents": True}
    r = _post(server, "/v1/rerank", body)
    assert r.status_code == 200, r.text
    doc = r.json()
    expected = 1 / (1 + np.exp(-_logits(session, "positive", DOCS)))
    got = {x["index"]: x["relevance_score"] for x in doc["results"]}
    assert sorted(got) == list(range(len(DOCS)))
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expected, atol=2e-5)
    scores = [x["relevance_score"] for x in doc["results"]]
    assert scores == sorted(scores, reverse=True)
    by_index = {x["index"]: x["document"] for x in doc["results"]}
    assert by_index[3] == {"text": DOCS[3], "id": "d3"} and by_index[0] == {"text": DOCS[0]}
    mask = pair_feeds(["positive"] * len(DOCS), DOCS)["attention_mask"]
    assert doc["usage"]["total_tokens"] == doc["usage"]["prompt_tokens"] == int(mask.sum())
    assert doc["model"] == "minilm_rerank" and "server-timing" in r.headers
    # the model's sentiment, not chance: the most positive tweets outrank the most negative
    assert got[0] > got[1] and got[2] > got[3]
    for path in ("/rerank", "/v2/rerank"):  # infinity's and Cohere's v2 paths
        top = _post(server, path, {**body, "top_n": 2, "return_documents": False}).json()
        assert [x["index"] for x in top["results"]] == [x["index"] for x in doc["results"][:2]]
        assert "document" not in top["results"][0]


def test_tei_shape_raw_scores(server: ServerProcess, session: Any) -> None:
    query = DOCS[1]  # a tweet as the query
    r = _post(server, "/rerank", {"query": query, "texts": DOCS, "raw_scores": True, "return_text": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == len(DOCS)
    expected = _logits(session, query, DOCS)
    for item in out:
        assert item["text"] == DOCS[item["index"]]
        assert item["score"] == pytest.approx(float(expected[item["index"]]), abs=1e-4)
    assert [x["score"] for x in out] == sorted((x["score"] for x in out), reverse=True)


def test_a_thousand_documents_in_batches(server: ServerProcess, session: Any) -> None:
    from milliserve.examples.sentiment import load_tweets

    docs = [t for t, _ in load_tweets()[:1000]]
    query = LABEL_QUERIES[0]
    r = _post(server, "/v1/rerank", {"model": "minilm_rerank", "query": query, "documents": docs})
    assert r.status_code == 200, r.text
    got = np.zeros(len(docs))
    for x in r.json()["results"]:
        got[x["index"]] = x["relevance_score"]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-_logits(session, query, docs))), atol=2e-5)
    stats = httpx.get(f"http://{server.http_url}/v2/models/minilm_cross/stats").json()
    (model,) = stats["model_stats"]
    assert model["inference_count"] >= 1000
    # split into runs of at most 32 pairs (length buckets of 8 and up), never one giant batch
    sizes = [b["batch_size"] for b in model["batch_stats"]]
    assert sizes and max(sizes) <= 32


def test_a_query_that_fills_the_length_is_cut_too(server: ServerProcess, session: Any, repo: Path) -> None:
    from tokenizers import Tokenizer

    query = " ".join(["driverless"] * 400)
    r = _post(server, "/v1/rerank", {"model": "minilm_rerank", "query": query, "documents": DOCS[:2]})
    assert r.status_code == 200, r.text
    tok = Tokenizer.from_file(str(repo / "minilm_rerank" / "tokenizer.json"))
    tok.enable_truncation(256, strategy="longest_first")
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch([(query, d) for d in DOCS[:2]])
    feeds = {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }
    expected = 1 / (1 + np.exp(-session.run(["logits"], feeds)[0].reshape(-1)))
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[0], got[1]], expected, atol=2e-5)
    assert r.json()["usage"]["total_tokens"] == 2 * 256


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/rerank", {"model": "minilm_rerank", "query": "q", "documents": []}, 400, "empty list"),
        (
            "/v1/rerank",
            {"model": "minilm_rerank", "query": "q", "documents": ["d"] * 1001},
            400,
            "at most 1000",
        ),
        ("/rerank", {"query": "q", "texts": []}, 400, "empty list"),
        ("/v1/rerank", {"model": "minilm_cross", "query": "q", "documents": ["d"]}, 400, "not a reranker"),
        ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["d"]}, 404, "nope"),
    ],
)
def test_refusals_say_why(
    server: ServerProcess, path: str, body: dict[str, Any], status: int, words: str
) -> None:
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    doc = r.json()
    message = doc["error"] if isinstance(doc["error"], str) else doc["error"]["message"]
    assert words in message
    if "texts" in body:  # TEI's error shape for TEI's request shape
        assert doc["error_type"] == "validation"


def test_the_peer_folder_runs_the_same_graph(server: ServerProcess, repo: Path, tmp_path: Path) -> None:
    """The Hugging Face folder a peer loads: its tokenizer, called as infinity's ONNX engine
    calls it (pairs, longest first, no token types), makes the ids and mask the pipeline
    makes, and its model.onnx gives the logits the server gives."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    out = write_peer_folder(repo, tmp_path / "peer")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["num_labels"] == 1
    tok = AutoTokenizer.from_pretrained(str(out))
    query, docs = "negative", [d for d in DOCS if d]
    enc = tok(
        [(query, d) for d in docs], padding=True, truncation="longest_first", return_token_type_ids=False
    )
    ours = pair_feeds([query] * len(docs), docs)
    np.testing.assert_array_equal(np.array(enc["input_ids"]), ours["input_ids"])
    np.testing.assert_array_equal(np.array(enc["attention_mask"]), ours["attention_mask"])
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "model.onnx"))
    (logits,) = session.run(["logits"], {k: np.array(v, dtype=np.int64) for k, v in enc.items()})
    r = _post(server, "/rerank", {"query": query, "texts": docs, "raw_scores": True})
    got = {x["index"]: x["score"] for x in r.json()}
    np.testing.assert_allclose([got[i] for i in range(len(docs))], logits.reshape(-1), atol=1e-4)


def test_listed_by_v1_models_as_a_reranker(server: ServerProcess) -> None:
    listed = httpx.get(f"http://{server.http_url}/v1/models").json()["data"]
    by_name = {m["id"]: m for m in listed}
    assert by_name["minilm_rerank"]["capabilities"] == ["rerank"]
    assert "minilm_cross" not in by_name  # the graph alone is no reranker
    one = httpx.get(f"http://{server.http_url}/v1/models/minilm_rerank").json()
    assert one == {**by_name["minilm_rerank"], "created": one["created"]}
    r = httpx.get(f"http://{server.http_url}/v1/models/minilm_cross")
    assert r.status_code == 400 and "not a generative, embedding, reranking or classifying model" in r.text
    assert httpx.get(f"http://{server.http_url}/v1/models/nope").status_code == 404
