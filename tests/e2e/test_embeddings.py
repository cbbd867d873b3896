"""OpenAI's /v1/embeddings on embedding pipelines (tokenizer -> MiniLM -> pooling), through a
real server and the real ``openai`` SDK, checked against sentence-transformers' own
embeddings of the same texts from the same weights (issue 25, part 1)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import yaml

from milliserve.examples.minilm import minilm_dir
from milliserve.examples.minilm_embed import PIPELINE_YAML, build_minilm_embed
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

TEXTS = [
    "what a lovely day",
    "self-driving cars will never be safe, not in a million years",
    "I love my dog",
    "Ünïcödé and emoji 🚀 in one sentence",
    "a",
]
LONG = " ".join(["embedding"] * 400)  # over MiniLM's 256 tokens


def _variant(repo: Path, name: str, pooling: str, **tokenizer: Any) -> None:
    """Another pipeline over the same encoder: other pooling, other tokenizer options."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "tokenizer.json").write_bytes((repo / "minilm_embed" / "tokenizer.json").read_bytes())
    text = PIPELINE_YAML.replace("name: minilm_embed", f"name: {name}")
    text = text.replace(
        "    - pooling: {input: token_embeddings, mask: attention_mask, mode: mean, normalize: true,\n"
        "                int8_scale: 0.25}",
        f"    - pooling: {pooling}",
    )
    for key, value in tokenizer.items():
        text = text.replace(f"        {key}: ", f"        {key}: {value}  # was ")
    (repo / name / "config.yaml").write_text(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("embeddings")
    build_minilm_embed(repo, optimized=False)  # FP32: compared with sentence-transformers' vectors
    _variant(repo, "minilm_cls", "{mode: cls, normalize: true}")
    _variant(repo, "minilm_last", "{mode: last_token, normalize: false}")
    _variant(repo, "minilm_mrl", "{mode: mean, dimensions: [256, 128]}", overflow="refuse")
    with ServerProcess(repo) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def st() -> Any:
    """sentence-transformers with the packaged weights, offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu")


def _st_with(pooling: str, normalize: bool) -> Any:
    from sentence_transformers import SentenceTransformer

    try:  # where sentence-transformers 6 keeps them (its old `models` path warns)
        from sentence_transformers.base.modules.normalize import Normalize
        from sentence_transformers.base.modules.transformer import Transformer
        from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    except ImportError:  # sentence-transformers 5
        from sentence_transformers.models import Normalize, Pooling, Transformer

    word = Transformer(str(minilm_dir()), max_seq_length=256)
    modules = [word, Pooling(384, pooling_mode=pooling)]
    return SentenceTransformer(modules=[*modules, *([Normalize()] if normalize else [])], device="cpu")


def _cos(a: Any, b: Any) -> np.ndarray[Any, Any]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_sdk_float_and_base64_match_sentence_transformers(client: openai.OpenAI, st: Any) -> None:
    expected = st.encode([*TEXTS, LONG])
    # the SDK's default asks for base64 and decodes it; float is the JSON list
    default = client.embeddings.create(model="minilm_embed", input=[*TEXTS, LONG])
    floats = client.embeddings.create(model="minilm_embed", input=[*TEXTS, LONG], encoding_format="float")
    for answer in (default, floats):
        got = np.array([d.embedding for d in answer.data])
        assert [d.index for d in answer.data] == list(range(len(TEXTS) + 1))
        assert got.shape == (len(TEXTS) + 1, 384)
        assert _cos(got, expected).min() >= 0.999  # the long text too: both cut it at 256 tokens
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    tokens = [len(st.tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in [*TEXTS, LONG]]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(tokens)
    assert tokens[-1] == 256
    one = client.embeddings.create(model="minilm_embed", input=TEXTS[1], encoding_format="float")
    assert len(one.data) == 1 and _cos(one.data[0].embedding, expected[1]) >= 0.999


def test_base64_is_little_endian_float32(server: ServerProcess) -> None:
    body = {"model": "minilm_embed", "input": ["hello", "world"], "encoding_format": "base64"}
    doc = httpx.post(f"http://{server.http_url}/v1/embeddings", json=body).json()
    floats = httpx.post(
        f"http://{server.http_url}/v1/embeddings", json={**body, "encoding_format": "float"}
    ).json()
    for b64, f in zip(doc["data"], floats["data"], strict=True):
        vec = np.frombuffer(base64.b64decode(b64["embedding"]), dtype="<f4")
        np.testing.assert_allclose(vec, f["embedding"], rtol=1e-6)
    assert doc["object"] == "list" and doc["model"] == "minilm_embed"


@pytest.mark.parametrize(
    ("model", "pooling", "normalize"), [("minilm_cls", "cls", True), ("minilm_last", "lasttoken", False)]
)
def test_declared_pooling(client: openai.OpenAI, model: str, pooling: str, normalize: bool) -> None:
    expected = _st_with(pooling, normalize).encode(TEXTS)
    got = np.array([d.embedding for d in client.embeddings.create(model=model, input=TEXTS).data])
    assert _cos(got, expected).min() >= 0.999
    # without normalisation the vectors keep their length
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-3)


def test_dimensions_where_the_config_allows_them(client: openai.OpenAI, st: Any) -> None:
    full = st.encode(TEXTS)
    for size in (128, 256):
        got = np.array(
            [
                d.embedding
                for d in client.embeddings.create(model="minilm_mrl", input=TEXTS, dimensions=size).data
            ]
        )
        cut = full[:, :size] / np.linalg.norm(full[:, :size], axis=1, keepdims=True)  # truncate, renormalise
        assert got.shape == (len(TEXTS), size)
        assert _cos(got, cut).min() >= 0.999
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    same = client.embeddings.create(model="minilm_embed", input="x", dimensions=384)
    assert len(same.data[0].embedding) == 384
    for model, size in (("minilm_embed", 128), ("minilm_mrl", 100)):
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model=model, input="x", dimensions=size)
        assert info.value.body["param"] == "dimensions"  # type: ignore[index]
        assert f"'dimensions' is {size}" in info.value.body["message"]  # type: ignore[index]


def test_token_ids_in_place_of_text(client: openai.OpenAI, st: Any) -> None:
    ids = [st.tokenizer(t)["input_ids"] for t in TEXTS[:3]]
    by_ids = client.embeddings.create(model="minilm_embed", input=ids, encoding_format="float")
    by_text = client.embeddings.create(model="minilm_embed", input=TEXTS[:3], encoding_format="float")
    got = np.array([d.embedding for d in by_ids.data])
    assert _cos(got, [d.embedding for d in by_text.data]).min() >= 0.9999
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)
    single = client.embeddings.create(model="minilm_embed", input=ids[0], encoding_format="float")
    assert _cos(single.data[0].embedding, got[0]) >= 0.9999
    with pytest.raises(openai.BadRequestError, match="token id 99999"):
        client.embeddings.create(model="minilm_embed", input=[101, 99999, 102])


def test_many_inputs_are_split_into_batches(client: openai.OpenAI, server: ServerProcess, st: Any) -> None:
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'the weather'}" for i in range(500)]
    answer = client.embeddings.create(model="minilm_embed", input=texts, encoding_format="float")
    assert [d.index for d in answer.data] == list(range(500))
    sample = [0, 31, 32, 250, 499]
    got = np.array([answer.data[i].embedding for i in sample])
    assert _cos(got, st.encode([texts[i] for i in sample])).min() >= 0.999
    stats = httpx.get(f"http://{server.http_url}/v2/models/minilm_tokens/stats").json()["model_stats"][0]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert sizes and max(sizes) <= 32  # never one tensor of 500 rows


def _encoder_runs(server: ServerProcess) -> dict[int, int]:
    """The encoder's executions so far, by batch size."""
    stats = httpx.get(f"http://{server.http_url}/v2/models/minilm_tokens/stats").json()["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


@pytest.mark.parametrize("model", ["minilm_embed", "minilm_cls", "minilm_last"])
def test_texts_of_mixed_lengths_run_as_length_buckets(
    client: openai.OpenAI, server: ServerProcess, model: str
) -> None:
    rng = np.random.default_rng(3)
    words = ["cats", "weather", "tomorrow", "lovely", "server", "latency", "budget", "queue"]
    texts = [" ".join(rng.choice(words, n)) for n in rng.permutation(np.arange(1, 97, 3))]
    alone = [client.embeddings.create(model=model, input=t, encoding_format="float").data[0] for t in texts]
    before = _encoder_runs(server)
    together = client.embeddings.create(model=model, input=texts, encoding_format="float")
    after = _encoder_runs(server)
    got = np.array([d.embedding for d in together.data])
    # each text's vector as if it were alone: the runs are cut to their own longest text
    assert _cos(got, [d.embedding for d in alone]).min() >= 0.99999
    ran = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert ran.get(32, 0) == 0 and sum(ran.values()) >= 2, ran  # never one padded run of 32


def test_over_the_max_length_truncated_or_refused(client: openai.OpenAI) -> None:
    cut = client.embeddings.create(model="minilm_embed", input=LONG)
    assert cut.usage.prompt_tokens == 256
    with pytest.raises(openai.BadRequestError, match="at most 256"):
        client.embeddings.create(model="minilm_mrl", input=LONG)  # overflow: refuse


def test_openai_errors(server: ServerProcess, client: openai.OpenAI) -> None:
    url = f"http://{server.http_url}/v1/embeddings"
    cases = [
        ({"model": "nope", "input": "x"}, 404, None, "model_not_found"),
        ({"model": "minilm_tokens", "input": "x"}, 400, "model", None),  # a model, not an embedding model
        ({"model": "minilm_embed", "input": "x", "foo": 1}, 400, "foo", None),
        ({"model": "minilm_embed", "input": []}, 400, "input", None),
        ({"model": "minilm_embed", "input": ""}, 400, "input", None),
        ({"model": "minilm_embed", "input": ["a", 1]}, 400, "input", None),
        ({"model": "minilm_embed", "input": ["a"] * 2049}, 400, "input", None),
        ({"model": "minilm_embed", "input": "x", "encoding_format": "int8"}, 400, "encoding_format", None),
        ({"model": "minilm_embed", "input": "x", "dimensions": 0}, 400, "dimensions", None),
        ({"input": "x"}, 400, "model", None),
    ]
    for body, status, param, code in cases:
        r = httpx.post(url, json=body)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["param"], error["code"]) == (param, code), (body, error)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


def test_listed_beside_other_models_and_served_over_oip(server: ServerProcess, client: openai.OpenAI) -> None:
    names = {m.id for m in client.models.list()}
    assert {"minilm_embed", "minilm_cls", "minilm_last", "minilm_mrl"} <= names
    assert "minilm_tokens" not in names  # the encoder alone is not an embedding model
    assert client.models.retrieve("minilm_embed").id == "minilm_embed"
    listed = {m["id"]: m for m in httpx.get(f"http://{server.http_url}/v1/models").json()["data"]}
    assert listed["minilm_embed"]["capabilities"] == ["embed"]  # as infinity's /models says it
    body = {"inputs": [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": ["hi", "there"]}]}
    doc = httpx.post(f"http://{server.http_url}/v2/models/minilm_embed/infer", json=body).json()
    shapes = {o["name"]: o["shape"] for o in doc["outputs"]}
    assert shapes == {"embedding": [2, 384], "tokens": [2, 1]}


def test_compact_embedding_types(server: ServerProcess) -> None:
    """int8, uint8, binary and ubinary (issue 63, item 3): the FP32 vectors quantized exactly
    as runtime/embedding_types.py says, integers in JSON and their bytes in base64."""
    from milliserve.runtime.embedding_types import quantize

    url = f"http://{server.http_url}/v1/embeddings"
    body = {"model": "minilm_embed", "input": TEXTS, "encoding_format": "float"}
    floats = np.array([d["embedding"] for d in httpx.post(url, json=body).json()["data"]], dtype=np.float32)
    scale = float(
        yaml.safe_load(PIPELINE_YAML)["ensemble_scheduling"]["step"][2]["pooling"].get("int8_scale", 1.0)
    )
    for kind, dtype, width in (
        ("int8", np.int8, 384),
        ("uint8", np.uint8, 384),
        ("binary", np.int8, 48),
        ("ubinary", np.uint8, 48),
    ):
        expected = quantize(floats, kind, scale)
        r = httpx.post(url, json={**body, "embedding_type": kind})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        assert got.shape == (len(TEXTS), width)
        np.testing.assert_array_equal(got, expected)
        b64 = httpx.post(url, json={**body, "embedding_type": kind, "encoding_format": "base64"}).json()
        raw = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype=dtype) for d in b64["data"]])
        np.testing.assert_array_equal(raw, expected)
    # int8 keeps what cosine similarity ranks: the nearest text to each is the FP32 one's
    q = quantize(floats, "int8", scale).astype(np.int32)
    np.testing.assert_array_equal(
        np.argsort(-(q @ q.T), axis=1)[:, 1], np.argsort(-(floats @ floats.T), axis=1)[:, 1]
    )
    refused = httpx.post(url, json={**body, "embedding_type": "int4"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "embedding_type"
    # vectors that are not normalised have no int8 scale unless the config sets one
    unscaled = httpx.post(url, json={**body, "model": "minilm_last", "embedding_type": "int8"})
    assert unscaled.status_code == 400 and "int8_scale" in unscaled.json()["error"]["message"]
    assert (
        httpx.post(url, json={**body, "model": "minilm_last", "embedding_type": "binary"}).status_code == 200
    )
