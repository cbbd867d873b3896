"""Request bodies from a text file: file order or a seeded Zipf stream, over HTTP or gRPC."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from milliserve.bench.text_stream import read_texts, repeat_share, text_stream, token_bodies
from milliserve.bench.workload import build_workload, parse_target
from milliserve.errors import ConfigError
from milliserve.protocol.proto import oip_pb2 as pb


def test_texts_skip_empty_lines_and_an_empty_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("first\n\n   \nsecond ünïcode\r\nthird\n", encoding="utf-8")
    assert read_texts(f) == ["first", "second ünïcode", "third"]
    f.write_text("\n\n")
    with pytest.raises(ConfigError, match="no texts"):
        read_texts(f)


def test_zipf_stream_is_seeded_and_favours_the_first_lines() -> None:
    texts = [f"t{i}" for i in range(200)]
    assert text_stream(texts, None) == texts
    a, b = text_stream(texts, 1.1, length=5000), text_stream(texts, 1.1, length=5000)
    assert a == b and len(a) == 5000
    counts = Counter(a)
    assert counts["t0"] > counts["t1"] > counts["t9"] > counts.get("t150", 0)
    assert 0.5 < repeat_share(a) < 1.0
    assert repeat_share(texts) == 0.0
    with pytest.raises(ConfigError, match="exponent"):
        text_stream(texts, 0.0)


def test_text_workload_over_http_json_and_grpc(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("good day\nbad day\n")
    http = build_workload(
        parse_target("http://127.0.0.1:9"), "m", data=str(f), binary=False, zipf=1.1, text_input="TEXT"
    )
    first = orjson.loads(http.bodies[0])
    assert first["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["good day"]}]
    assert len(http.bodies) > 2  # a stream, not the file once
    grpc = build_workload(parse_target("grpc://127.0.0.1:9"), "m", data=str(f), text_input="TEXT")
    msg = pb.ModelInferRequest.FromString(grpc.bodies[1])
    assert msg.model_name == "m" and msg.inputs[0].name == "TEXT" and list(msg.inputs[0].shape) == [1, 1]
    assert msg.raw_input_contents[0][4:] == b"bad day"  # 4-byte length prefix, then the text
    with pytest.raises(ConfigError, match="--zipf"):
        build_workload(parse_target("http://127.0.0.1:9"), "m", zipf=1.1)


def test_token_bodies_carry_ids_and_mask_of_each_text() -> None:
    from milliserve.examples.minilm import tokenizer_path

    long = "a much longer sentence than the first " * 20
    bodies = token_bodies(["hello world", long], tokenizer_path(), 16)
    ids, mask = bodies[0]["inputs"]
    assert ids["shape"] == mask["shape"] == [1, 4] and ids["data"][0] == 101  # [CLS] hello world [SEP]
    assert bodies[1]["inputs"][0]["shape"] == [1, 16]
