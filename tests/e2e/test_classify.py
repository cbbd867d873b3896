"""/v1/classify (infinity's shape) and TEI's /predict on the sentiment pipeline of the
example repository, through a real server: every label with its probability, best first,
the same numbers the pipeline answers over the Open Inference Protocol (issue 63, item 2)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from milliserve.testing import ServerProcess

# the example repository builds the sentiment example (optimize runs) in the first setup
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

TEXTS = ["what a lovely day, I love this car", "this is the worst ride of my life", "Ünïcödé 🚗"]


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://{server.http_url}{path}", json=body, timeout=60)


def _oip(server: ServerProcess, texts: list[str]) -> tuple[list[list[float]], list[str]]:
    body = {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}],
        "outputs": [{"name": "probabilities"}, {"name": "label"}],
    }
    r = _post(server, "/v2/models/sentiment/infer", body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    p = out["probabilities"]
    return [p[i : i + 2] for i in range(0, len(p), 2)], out["label"]


def test_classify_matches_the_pipeline(server: ServerProcess) -> None:
    r = _post(server, "/v1/classify", {"model": "sentiment", "input": TEXTS})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "classify" and doc["model"] == "sentiment" and "server-timing" in r.headers
    probabilities, labels = _oip(server, TEXTS)
    assert len(doc["data"]) == len(TEXTS)
    for row, p, label in zip(doc["data"], probabilities, labels, strict=True):
        assert row[0]["label"] == label
        assert {x["label"] for x in row} == {"negative", "positive"}
        got = {x["label"]: x["score"] for x in row}
        assert got["negative"] == pytest.approx(p[0], abs=1e-6)
        assert got["positive"] == pytest.approx(p[1], abs=1e-6)
        assert row[0]["score"] >= row[1]["score"]
    assert doc["data"][0][0]["label"] == "positive" and doc["data"][1][0]["label"] == "negative"
    # one text alone: its INT8 model scales activations over the batch, so its score moves a
    # little with its batch mates (docs/design.md); the label stays
    top = _post(server, "/classify", {"model": "sentiment", "input": TEXTS[0], "top_k": 1}).json()
    assert [x["label"] for x in top["data"][0]] == ["positive"]
    assert top["data"][0][0]["score"] == pytest.approx(doc["data"][0][0]["score"], abs=0.05)
    # the sentiment model applies its softmax in its graph: raw scores are the same numbers
    raw = _post(server, "/v1/classify", {"model": "sentiment", "input": TEXTS, "raw_scores": True}).json()
    for raw_row, row in zip(raw["data"], doc["data"], strict=True):
        assert [x["label"] for x in raw_row] == [x["label"] for x in row]
        assert [x["score"] for x in raw_row] == pytest.approx([x["score"] for x in row], abs=1e-6)


def test_predict_tei_shapes(server: ServerProcess) -> None:
    one = _post(server, "/predict", {"model": "sentiment", "inputs": TEXTS[0]})
    assert one.status_code == 200, one.text
    single = one.json()
    assert [x["label"] for x in single] == ["positive", "negative"]
    batch = _post(server, "/predict", {"model": "sentiment", "inputs": [[t] for t in TEXTS]}).json()
    assert len(batch) == len(TEXTS) and [x["label"] for x in batch[0]] == ["positive", "negative"]
    assert [x["label"] for x in batch[1]] == ["negative", "positive"]
    # a pair is refused in TEI's error shape
    pair = _post(server, "/predict", {"model": "sentiment", "inputs": TEXTS[:2]})
    assert pair.status_code == 400 and "pair" in pair.json()["error"]
    assert pair.json()["error_type"] == "validation"


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/classify", {"model": "sentiment", "input": []}, 400, "empty list"),
        ("/v1/classify", {"model": "fraud_mlp", "input": ["x"]}, 400, "not a classifier"),
        ("/v1/classify", {"model": "nope", "input": ["x"]}, 404, "nope"),
        # the example repository has two classifiers (sentiment, sentiment_cascade)
        ("/predict", {"inputs": "x"}, 400, "'model' is required"),
    ],
)
def test_refusals_say_why(
    server: ServerProcess, path: str, body: dict[str, Any], status: int, words: str
) -> None:
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in (error if isinstance(error, str) else error["message"])


def test_listed_by_v1_models_as_a_classifier(server: ServerProcess) -> None:
    by_name = {m["id"]: m for m in httpx.get(f"http://{server.http_url}/v1/models").json()["data"]}
    assert by_name["sentiment"]["capabilities"] == ["classify"]
    assert by_name["sentiment_cascade"]["capabilities"] == ["classify"]
    assert by_name["sentiment"]["object"] == "model" and by_name["sentiment"]["owned_by"] == "milliserve"
    assert "sentiment_model" not in by_name  # a tensor model: /v2/models/sentiment_model/infer
    one = httpx.get(f"http://{server.http_url}/v1/models/sentiment").json()
    assert one["id"] == "sentiment" and one["capabilities"] == ["classify"]
