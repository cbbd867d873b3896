"""OpenAI's embeddings request and answer (openai/embeddings.py), without a server."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from milliserve.errors import InvalidInputError
from milliserve.openai.embeddings import MAX_INPUTS, embeddings_response, parse_embeddings


def test_every_input_form() -> None:
    assert parse_embeddings({"model": "m", "input": "hi"}).inputs == ["hi"]
    assert parse_embeddings({"model": "m", "input": ["a", "b"]}).inputs == ["a", "b"]
    assert parse_embeddings({"model": "m", "input": [1, 2, 3]}).inputs == [[1, 2, 3]]
    assert parse_embeddings({"model": "m", "input": [[1], [2, 3]]}).inputs == [[1], [2, 3]]
    r = parse_embeddings(
        {"model": "m", "input": "x", "encoding_format": "base64", "dimensions": 64, "user": "u"}
    )
    assert r.base64 and r.dimensions == 64


@pytest.mark.parametrize(
    ("doc", "param", "match"),
    [
        ({"input": "x"}, "model", "'model' is required"),
        ({"model": "m"}, "input", "'input' is required"),
        ({"model": "m", "input": None}, "input", "is NoneType"),
        ({"model": "m", "input": []}, "input", "empty list"),
        ({"model": "m", "input": [[]]}, "input", "empty list of token ids"),
        ({"model": "m", "input": [1, True]}, "input", "holds True"),
        ({"model": "m", "input": [-1]}, "input", "holds -1"),
        ({"model": "m", "input": [2**40]}, "input", "integers from 0"),
        ({"model": "m", "input": ["a", [1]]}, "input", "mixes strings and list"),
        ({"model": "m", "input": [1.5]}, "input", "holds float"),
        ({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, "input", "at most 2048"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
        ({"model": "m", "input": "x", "dimensions": True}, "dimensions", "positive integer"),
        ({"model": "m", "input": "x", "user": 3}, "user", "'user' must be a string"),
        ({"model": "m", "input": "x", "truncate": True}, "truncate", "unrecognized request argument"),
    ],
)
def test_refusals_name_the_field(doc: dict[str, Any], param: str, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match) as info:
        parse_embeddings(doc)
    assert info.value.args[1] == param


def test_answer_in_floats_and_base64() -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    doc = orjson.loads(embeddings_response("m", vectors, 5, b64=False))
    assert doc["object"] == "list" and doc["model"] == "m"
    assert doc["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [d["index"] for d in doc["data"]] == [0, 1] and doc["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(np.array([d["embedding"] for d in doc["data"]]), vectors, rtol=1e-6)
    b64 = orjson.loads(embeddings_response("m", vectors, 5, b64=True))
    got = np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64["data"]])
    np.testing.assert_array_equal(got, vectors)
