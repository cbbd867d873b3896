"""Property-based fuzzing of the three decoders (JSON, binary tensor extension, gRPC) and of
validation behind them: whatever a client sends, the answer is a decoded request or a
RequestError (a 4xx), never another exception (a 500), and nothing is allocated from a
declared shape that the bytes present cannot back."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from milliserve.config.model_config import ModelConfig
from milliserve.errors import RequestError
from milliserve.protocol import grpc_codec, json_codec
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.runtime.validation import model_io, validate_request

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DATATYPES = ["FP32", "INT64", "BYTES", "BOOL", "FP16", "UINT8", "INT8", "BF16", "NOPE", ""]
# the models a decoded request is validated against: fixed dims, variable dims, text
IOS = [
    model_io(
        ModelConfig.model_validate(
            {
                "name": "m",
                "max_batch_size": 8,
                "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
            }
        )
    ),
    model_io(
        ModelConfig.model_validate(
            {
                "name": "t",
                "max_batch_size": 0,
                "input": [
                    {"name": "ids", "data_type": "TYPE_INT64", "dims": [-1, -1]},
                    {"name": "text", "data_type": "TYPE_STRING", "dims": [-1]},
                ],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}],
            }
        )
    ),
]

dims = st.one_of(
    st.integers(min_value=-3, max_value=6),
    st.sampled_from([2**31, 2**62, 2**63 - 1, 10**30]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
)
shapes = st.one_of(st.lists(dims, max_size=5), st.none(), st.integers(), st.text(max_size=4))
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=6)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
names = st.sampled_from(["x", "ids", "text", "", "other"])


def _tensor() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": names, "datatype": st.sampled_from(DATATYPES), "shape": shapes},
        optional={"data": json_values, "parameters": json_values},
    )


def _accepted_or_refused(request: Any) -> None:
    """A decoded request validates or is refused with a RequestError, against every model."""
    for io in IOS:
        with contextlib.suppress(RequestError):
            validate_request(request, io)


@FUZZ
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"inputs": st.lists(_tensor(), max_size=3)},
            optional={"outputs": json_values, "parameters": json_values, "id": json_values},
        ),
    )
)
def test_json_bodies_decode_or_are_refused(doc: Any) -> None:
    body = json.dumps(doc).encode()  # the standard library writes integers of any size
    try:
        request = json_codec.decode_infer_request(body, None, "m", "")
    except RequestError:
        return
    _accepted_or_refused(request)


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_as_json_are_refused_cleanly(body: bytes) -> None:
    with contextlib.suppress(RequestError):
        json_codec.decode_infer_request(body, None, "m", "")


@FUZZ
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "name": names,
                "datatype": st.sampled_from(DATATYPES),
                "shape": shapes,
                "parameters": st.fixed_dictionaries(
                    {"binary_data_size": st.one_of(st.integers(-2, 64), st.sampled_from([2**40]), st.text())}
                ),
            }
        ),
        min_size=1,
        max_size=3,
    ),
    st.binary(max_size=64),
    st.one_of(st.none(), st.integers(-5, 400)),
    st.lists(st.integers(0, 2**32 - 1), max_size=3),
)
def test_binary_bodies_decode_or_are_refused(
    inputs: list[dict[str, Any]], payload: bytes, header_delta: int | None, prefixes: list[int]
) -> None:
    header = json.dumps({"inputs": inputs}).encode()
    # length prefixes of BYTES elements, some of them lying
    body = header + b"".join(struct.pack("<I", p) for p in prefixes) + payload
    header_len = len(header) if header_delta is None else header_delta
    try:
        request = json_codec.decode_infer_request(body, header_len, "m", "")
    except RequestError:
        return
    _accepted_or_refused(request)


grpc_shapes = st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(0, 6), max_size=5)


@FUZZ
@given(
    st.lists(
        st.tuples(names, st.sampled_from(DATATYPES), grpc_shapes, st.binary(max_size=48)),
        max_size=3,
    ),
    st.booleans(),
    st.lists(st.floats(width=32, allow_nan=True), max_size=8),
    st.lists(st.binary(max_size=8), max_size=4),
)
def test_grpc_messages_decode_or_are_refused(
    tensors: list[tuple[str, str, list[int], bytes]],
    raw: bool,
    floats: list[float],
    strings: list[bytes],
) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, data in tensors:
        t = msg.inputs.add(name=name, datatype=datatype)
        t.shape.extend(shape)
        if raw:
            msg.raw_input_contents.append(data)
        else:
            t.contents.fp32_contents.extend(floats)
            t.contents.bytes_contents.extend(strings)
    try:
        request = grpc_codec.decode_infer_request(msg)
    except RequestError:
        return
    _accepted_or_refused(request)
