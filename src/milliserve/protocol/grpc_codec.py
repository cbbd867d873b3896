"""Protobuf messages of the OIP gRPC service <-> protocol types."""

from __future__ import annotations

from collections.abc import Collection
from math import prod
from typing import Any

import numpy as np

from milliserve.errors import ForbiddenError, InvalidInputError, MalformedRequestError
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.protocol.raw import array_from_raw, array_to_raw, check_shape
from milliserve.protocol.types import (
    InferRequest,
    InferResponse,
    InferTensor,
    RequestedOutput,
    SharedMemoryInput,
)

__all__ = [
    "decode_infer_request",
    "encode_infer_response",
    "parameters_from_proto",
    "parameters_to_proto",
    "shared_memory_off",
    "split_raw_contents",
]

# raw_input_contents: field 7 of ModelInferRequest, length-delimited
_RAW_TAG = (7 << 3) | 2


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; (-1, pos) when it is cut or too long."""
    result = shift = 0
    while pos < len(view) and shift < 64:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    return -1, pos


def split_raw_contents(message: bytes | memoryview) -> tuple[bytes, list[memoryview]] | None:
    """A serialized ModelInferRequest's ``raw_input_contents`` as read-only views of
    ``message`` (not copied), and the rest of it, to parse as usual. protobuf copies each
    bytes field twice (when it parses, and again for each read of it): 16 MB of tensor held
    the event loop 20 to 40 ms. None when the message's top level is not well formed (the
    usual parse then says why)."""
    view = memoryview(message).toreadonly()
    rest = bytearray()
    contents: list[memoryview] = []
    pos, end = 0, len(view)
    while pos < end:
        start = pos
        tag, pos = _varint(view, pos)
        wire = tag & 7
        if tag < 0 or wire not in (0, 1, 2, 5):
            return None
        if wire == 0:
            value, pos = _varint(view, pos)
            if value < 0:
                return None
        elif wire == 2:
            length, pos = _varint(view, pos)
            if length < 0 or pos + length > end:
                return None
            if tag == _RAW_TAG:
                contents.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        else:
            pos += 8 if wire == 1 else 4
        if pos > end:
            return None
        rest += view[start:pos]
    return bytes(rest), contents


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


def shared_memory_off(name: str) -> ForbiddenError:
    """The error for an input or output that names a shared-memory region on a server whose
    shared memory is off."""
    return ForbiddenError(
        f"tensor {name!r} refers to a shared memory region, but shared memory is off on this "
        "server (start it with --shared-memory system)"
    )


def decode_infer_request(
    msg: Any, shm: SharedMemoryInput | None = None, raw_contents: list[memoryview] | None = None
) -> InferRequest:
    """ModelInferRequest -> InferRequest. Raises MalformedRequestError / InvalidInputError.

    As Triton: an input's data comes from shared memory (``shared_memory_region``, read by
    ``shm``), its typed ``contents``, or the next entry of ``raw_input_contents``, which
    therefore holds one entry per input that has neither. ``raw_contents``: those entries
    when they were split from the message (``split_raw_contents``)."""
    raw: Any = msg.raw_input_contents if raw_contents is None else raw_contents
    if not msg.inputs:
        raise MalformedRequestError("request has no inputs")
    inputs: list[InferTensor] = []
    index = 0
    for t in msg.inputs:
        shape = tuple(t.shape)
        check_shape(t.name, shape)
        oip_to_numpy(t.datatype)
        params = parameters_from_proto(t.parameters) if t.parameters else {}
        if "shared_memory_region" in params:
            if t.HasField("contents"):
                raise InvalidInputError(
                    f"contents field must not be specified when using shared memory for {t.name!r} "
                    f"for model {msg.model_name!r}"
                )
            if shm is None:
                raise shared_memory_off(t.name)
            data = shm(t.name, t.datatype, shape, params)
        elif t.HasField("contents"):
            if raw:
                raise InvalidInputError(
                    "contents field must not be specified when using raw_input_contents for "
                    f"{t.name!r} for model {msg.model_name!r}"
                )
            data = _from_contents(t.name, t.datatype, shape, t.contents)
        elif index < len(raw):
            data = array_from_raw(t.name, t.datatype, shape, raw[index])
            index += 1
        elif not raw:  # no data anywhere: only an empty tensor is complete
            data = _from_contents(t.name, t.datatype, shape, t.contents)
        else:
            raise MalformedRequestError(
                f"unable to find data for input tensor {t.name!r} for model {msg.model_name!r} "
                f"in request: raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs"
            )
        inputs.append(InferTensor(t.name, t.datatype, shape, data, params))
    if index != len(raw):
        raise MalformedRequestError(
            f"raw_input_contents has {len(raw)} entries but only {index} inputs take raw data "
            "(inputs in contents or shared memory have none)"
        )
    outputs = [RequestedOutput(o.name, parameters_from_proto(o.parameters)) for o in msg.outputs]
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        inputs=inputs,
        id=msg.id,
        outputs=outputs or None,
        parameters=parameters_from_proto(msg.parameters),
    )


def encode_infer_response(resp: InferResponse, in_shared_memory: Collection[str] = ()) -> Any:
    """InferResponse -> ModelInferResponse, with every output in raw_output_contents. Outputs
    named in ``in_shared_memory`` were written to the client's regions: as Triton, they are
    described with an empty raw entry, so the entries still line up with the outputs."""
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    for out in resp.outputs:
        t = msg.outputs.add()
        t.name = out.name
        t.datatype = out.datatype
        t.shape.extend(out.shape)
        if in_shared_memory and out.name in in_shared_memory:
            msg.raw_output_contents.append(b"")
        else:
            msg.raw_output_contents.append(array_to_raw(out.datatype, out.data))
    if resp.parameters:
        parameters_to_proto(msg.parameters, resp.parameters)
    return msg
