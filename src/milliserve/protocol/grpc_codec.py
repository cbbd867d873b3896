"""Protobuf messages of the OIP gRPC service <-> protocol types."""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError, MalformedRequestError
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.protocol.raw import array_from_raw, array_to_raw, check_shape
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor, RequestedOutput

__all__ = [
    "decode_infer_request",
    "encode_infer_response",
    "parameters_from_proto",
    "parameters_to_proto",
]

# Which typed field of InferTensorContents carries each datatype.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}


def parameters_from_proto(params: Any) -> dict[str, Any]:
    """A map<string, InferParameter> as a plain dict."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which else None
    return out


def parameters_to_proto(target: Any, params: dict[str, Any]) -> None:
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = str(value)


def _from_contents(name: str, datatype: str, shape: tuple[int, ...], contents: Any) -> np.ndarray[Any, Any]:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInputError(
            f"input {name!r}: {datatype} must be sent in raw_input_contents (no typed contents field)"
        )
    values = getattr(contents, field)
    count = prod(shape)
    if len(values) != count:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} needs {count} elements, contents has {len(values)}"
        )
    if datatype == BYTES:
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    try:
        return np.asarray(values, dtype=oip_to_numpy(datatype)).reshape(shape)
    except OverflowError as exc:
        raise InvalidInputError(f"input {name!r}: value out of range for {datatype}: {exc}") from None


def decode_infer_request(msg: Any) -> InferRequest:
    """ModelInferRequest -> InferRequest. Raises MalformedRequestError / InvalidInputError."""
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise MalformedRequestError(
            f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs; "
            "send raw data for every input or for none"
        )
    if not msg.inputs:
        raise MalformedRequestError("request has no inputs")
    inputs: list[InferTensor] = []
    for i, t in enumerate(msg.inputs):
        shape = tuple(t.shape)
        check_shape(t.name, shape)
        oip_to_numpy(t.datatype)
        if raw:
            data = array_from_raw(t.name, t.datatype, shape, raw[i])
        else:
            data = _from_contents(t.name, t.datatype, shape, t.contents)
        inputs.append(InferTensor(t.name, t.datatype, shape, data, parameters_from_proto(t.parameters)))
    outputs = [RequestedOutput(o.name, parameters_from_proto(o.parameters)) for o in msg.outputs]
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        inputs=inputs,
        id=msg.id,
        outputs=outputs or None,
        parameters=parameters_from_proto(msg.parameters),
    )


def encode_infer_response(resp: InferResponse) -> Any:
    """InferResponse -> ModelInferResponse, with every output in raw_output_contents."""
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    for out in resp.outputs:
        t = msg.outputs.add()
        t.name = out.name
        t.datatype = out.datatype
        t.shape.extend(out.shape)
        msg.raw_output_contents.append(array_to_raw(out.datatype, out.data))
    if resp.parameters:
        parameters_to_proto(msg.parameters, resp.parameters)
    return msg
