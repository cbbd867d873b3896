"""A large ModelInferRequest's tensors are read where they arrived (issue 24, item 5):
protobuf copies a bytes field when it parses it and again each time it is read, and the two
copies of 16 MB held the event loop 20 to 40 ms. ``split_raw_contents`` returns them as
views of the received message, and the rest of the message parses as usual."""

from __future__ import annotations

import numpy as np
import pytest

from milliserve.protocol.grpc_codec import decode_infer_request, split_raw_contents
from milliserve.protocol.proto import oip_pb2 as pb


def _request() -> tuple[pb.ModelInferRequest, np.ndarray, np.ndarray]:
    a = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    b = np.arange(4, dtype=np.int64).reshape(4, 1)
    msg = pb.ModelInferRequest(model_name="m", model_version="2", id="req-1")
    msg.parameters["priority"].int64_param = 1
    for name, x, datatype in (("A", a, "FP32"), ("B", b, "INT64")):
        t = msg.inputs.add(name=name, datatype=datatype)
        t.shape.extend(x.shape)
        msg.raw_input_contents.append(x.tobytes())
    msg.outputs.add(name="OUT")
    return msg, a, b


def test_the_tensors_are_views_of_the_message_and_the_rest_parses_as_usual() -> None:
    msg, a, b = _request()
    wire = bytearray(msg.SerializeToString())
    split = split_raw_contents(memoryview(wire))
    assert split is not None
    rest, contents = split
    parsed = pb.ModelInferRequest.FromString(rest)
    assert not parsed.raw_input_contents
    assert parsed.model_name == "m" and parsed.id == "req-1" and [t.name for t in parsed.inputs] == ["A", "B"]
    assert parsed.parameters["priority"].int64_param == 1 and parsed.outputs[0].name == "OUT"
    assert [bytes(c) for c in contents] == list(msg.raw_input_contents)
    assert all(c.readonly and c.obj is wire for c in contents)  # views, not copies

    request = decode_infer_request(parsed, None, contents)
    expected = decode_infer_request(msg)
    for got, want in zip(request.inputs, expected.inputs, strict=True):
        assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
        np.testing.assert_array_equal(got.data, want.data)
    # the array reads the received bytes where they are, and cannot change them
    wire_array = np.frombuffer(wire, np.uint8)
    assert np.shares_memory(request.inputs[0].data, wire_array)
    assert not request.inputs[0].data.flags.writeable
    np.testing.assert_array_equal(request.inputs[0].data, a)
    np.testing.assert_array_equal(request.inputs[1].data, b)


@pytest.mark.parametrize(
    "wire",
    [
        b"\x3a\x10abc",  # a tensor longer than the message
        b"\x0a\xff\xff",  # a length cut short
        b"\x0b",  # a group (wire type 3): not in this message
        b"\x08" + b"\xff" * 11,  # a varint that never ends
    ],
)
def test_a_malformed_message_is_left_to_the_parser(wire: bytes) -> None:
    assert split_raw_contents(wire) is None
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError
        pb.ModelInferRequest.FromString(wire)
