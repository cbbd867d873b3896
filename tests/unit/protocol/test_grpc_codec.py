"""Protobuf <-> protocol types, including raw contents and typed contents."""

from __future__ import annotations

import numpy as np
import pytest

from milliserve.errors import InvalidInputError, MalformedRequestError
from milliserve.protocol import grpc_codec
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.protocol.raw import serialize_bytes
from milliserve.protocol.types import InferResponse, InferTensor


def test_raw_input_contents_decode() -> None:
    a = np.arange(4, dtype=np.int64).reshape(2, 2)
    msg = pb.ModelInferRequest(model_name="m", id="r1")
    t = msg.inputs.add(name="a", datatype="INT64", shape=[2, 2])
    t.parameters["k"].string_param = "v"
    msg.raw_input_contents.append(a.tobytes())
    msg.parameters["priority"].int64_param = 2
    req = grpc_codec.decode_infer_request(msg)
    np.testing.assert_array_equal(req.inputs[0].data, a)
    assert req.id == "r1" and req.parameters == {"priority": 2} and req.inputs[0].parameters == {"k": "v"}


def test_typed_contents_decode() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="f", datatype="FP32", shape=[3])
    t.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    s = msg.inputs.add(name="s", datatype="BYTES", shape=[1])
    s.contents.bytes_contents.append(b"hi")
    req = grpc_codec.decode_infer_request(msg)
    assert req.inputs[0].data.dtype == np.float32 and list(req.inputs[1].data) == [b"hi"]


def test_mismatched_raw_contents_are_rejected() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="a", datatype="FP32", shape=[2])
    msg.inputs.add(name="b", datatype="FP32", shape=[2])
    msg.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    with pytest.raises(MalformedRequestError, match="2 inputs"):
        grpc_codec.decode_infer_request(msg)
    msg2 = pb.ModelInferRequest(model_name="m")
    msg2.inputs.add(name="a", datatype="FP32", shape=[3])
    msg2.raw_input_contents.append(b"\x00" * 8)
    with pytest.raises(MalformedRequestError, match="needs 12"):
        grpc_codec.decode_infer_request(msg2)
    msg3 = pb.ModelInferRequest(model_name="m")
    msg3.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInputError, match="raw_input_contents"):
        grpc_codec.decode_infer_request(msg3)


def test_response_uses_raw_output_contents() -> None:
    resp = InferResponse(
        "m",
        "1",
        [
            InferTensor("y", "FP32", (2,), np.array([1, 2], np.float32)),
            InferTensor("s", "BYTES", (1,), np.array([b"x"], dtype=object)),
        ],
        id="r",
    )
    msg = grpc_codec.encode_infer_response(resp)
    assert msg.raw_output_contents[0] == np.array([1, 2], np.float32).tobytes()
    assert msg.raw_output_contents[1] == serialize_bytes(np.array([b"x"], dtype=object))
    assert list(msg.outputs[0].shape) == [2] and msg.id == "r"
