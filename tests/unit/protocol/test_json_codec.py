"""JSON tensors and the binary tensor extension."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from milliserve.errors import InvalidInputError, MalformedRequestError
from milliserve.protocol.json_codec import decode_infer_request, encode_infer_response
from milliserve.protocol.raw import serialize_bytes
from milliserve.protocol.types import InferResponse, InferTensor


def body(*inputs: dict, **extra: object) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def test_flat_and_nested_json_data_decode_to_the_same_array() -> None:
    flat = decode_infer_request(
        body({"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}), None, "m", ""
    )
    nested = decode_infer_request(
        body({"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}), None, "m", ""
    )
    assert flat.inputs[0].data.dtype == np.int32
    np.testing.assert_array_equal(flat.inputs[0].data, nested.inputs[0].data)


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("BOOL", [True, False], np.array([True, False])),
        ("UINT8", [0, 255], np.array([0, 255], np.uint8)),
        ("INT64", [-(2**40), 2**40], np.array([-(2**40), 2**40], np.int64)),
        ("FP16", [0.5, 1.5], np.array([0.5, 1.5], np.float16)),
        ("FP64", [0.1, 0.2], np.array([0.1, 0.2])),
        ("BYTES", ["héllo", ""], np.array(["héllo".encode(), b""], dtype=object)),
    ],
)
def test_datatypes_round_trip_through_json(datatype: str, data: list, expected: np.ndarray) -> None:
    req = decode_infer_request(
        body({"name": "x", "shape": [2], "datatype": datatype, "data": data}), None, "m", ""
    )
    got = req.inputs[0].data
    assert list(got) == list(expected)
    resp = InferResponse("m", "1", [InferTensor("y", datatype, (2,), got)])
    out, header = encode_infer_response(resp, req)
    assert header is None
    assert orjson.loads(out)["outputs"][0]["data"] == data


def test_binary_extension_inputs_and_outputs() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"ab", b"\x00\xff"], dtype=object)
    sb = serialize_bytes(s)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [2, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": a.nbytes},
                },
                {"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(sb)}},
            ],
            "outputs": [{"name": "a", "parameters": {"binary_data": True}}, {"name": "s"}],
        }
    )
    req = decode_infer_request(header + a.tobytes() + sb, len(header), "m", "")
    np.testing.assert_array_equal(req.inputs[0].data, a)
    assert list(req.inputs[1].data) == [b"ab", b"\x00\xff"]
    resp = InferResponse(
        "m",
        "1",
        [
            InferTensor("a", "FP32", (2, 3), a),
            InferTensor("s", "BYTES", (1,), np.array([b"ok"], dtype=object)),
        ],
    )
    out, hlen = encode_infer_response(resp, req)
    assert hlen is not None
    doc = orjson.loads(out[:hlen])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == a.nbytes
    assert doc["outputs"][1]["data"] == ["ok"]  # not asked for binary
    np.testing.assert_array_equal(np.frombuffer(out[hlen:], np.float32).reshape(2, 3), a)


def test_binary_data_output_parameter_applies_to_all_outputs() -> None:
    req = decode_infer_request(
        body(
            {"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]},
            parameters={"binary_data_output": True},
        ),
        None,
        "m",
        "",
    )
    resp = InferResponse("m", "1", [InferTensor("y", "FP32", (1,), np.array([2.0], np.float32))])
    out, hlen = encode_infer_response(resp, req)
    assert hlen is not None and out[hlen:] == np.array([2.0], np.float32).tobytes()


@pytest.mark.parametrize(
    ("raw", "header_len", "error", "match"),
    [
        (b"{not json", None, MalformedRequestError, "not valid JSON"),
        (b"[1, 2]", None, MalformedRequestError, "JSON object"),
        (b'{"inputs": []}', None, MalformedRequestError, "non-empty 'inputs'"),
        (
            body({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]}),
            None,
            InvalidInputError,
            "needs 2 elements, data has 1",
        ),
        (
            body({"name": "x", "shape": [2], "datatype": "FLOAT", "data": [1.0, 2.0]}),
            None,
            InvalidInputError,
            "unknown datatype 'FLOAT'",
        ),
        (
            body({"name": "x", "shape": [2], "datatype": "INT32", "data": [1.5, 2.0]}),
            None,
            InvalidInputError,
            "not valid INT32",
        ),
        (
            body({"name": "x", "shape": [1], "datatype": "UINT8", "data": [300]}),
            None,
            InvalidInputError,
            "UINT8",
        ),
        (
            body({"name": "x", "shape": [2], "datatype": "FP32", "data": [[1.0], [2.0, 3.0]]}),
            None,
            InvalidInputError,
            "regular array",
        ),
        (
            body({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}),
            None,
            MalformedRequestError,
            "non-negative",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
            None,
            MalformedRequestError,
            "not valid JSON",
        ),
    ],
)
def test_bad_json_bodies_are_named(raw: bytes, header_len: int | None, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        decode_infer_request(raw, header_len, "m", "")


def test_truncated_binary_payload_is_reported() -> None:
    header = orjson.dumps(
        {"inputs": [{"name": "a", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    )
    with pytest.raises(MalformedRequestError, match="truncated"):
        decode_infer_request(header + b"\x00" * 10, len(header), "m", "")
    with pytest.raises(MalformedRequestError, match="Inference-Header-Content-Length"):
        decode_infer_request(header, len(header) + 5, "m", "")


def test_bad_bytes_length_prefix_is_reported() -> None:
    payload = struct.pack("<I", 100) + b"short"
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "s",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(payload)},
                }
            ]
        }
    )
    with pytest.raises(MalformedRequestError, match="declares length 100"):
        decode_infer_request(header + payload, len(header), "m", "")


def test_bf16_binary_in_and_json_out() -> None:
    import ml_dtypes

    x = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    header = orjson.dumps(
        {"inputs": [{"name": "b", "shape": [2], "datatype": "BF16", "parameters": {"binary_data_size": 4}}]}
    )
    req = decode_infer_request(header + x.tobytes(), len(header), "m", "")
    assert req.inputs[0].data.dtype == x.dtype
    out, hlen = encode_infer_response(
        InferResponse("m", "1", [InferTensor("b", "BF16", (2,), req.inputs[0].data)]), req
    )
    assert hlen is None and orjson.loads(out)["outputs"][0]["data"] == [1.5, -2.0]
