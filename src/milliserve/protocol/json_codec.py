"""JSON tensors and the binary tensor extension of the Open Inference Protocol (HTTP).

A request body is either plain JSON, or (binary extension) a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw bytes of every
input that declares ``parameters.binary_data_size``, in input order.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
import orjson

from milliserve.errors import ForbiddenError, InvalidInputError, MalformedRequestError
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.raw import array_from_raw, array_to_raw, check_shape
from milliserve.protocol.types import (
    InferRequest,
    InferResponse,
    InferTensor,
    RequestedOutput,
    SharedMemoryInput,
)

__all__ = [
    "check_elements",
    "decode_infer_request",
    "decode_json_object",
    "encode_infer_response",
    "encode_json",
    "flag",
]

_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY


def encode_json(obj: Any) -> bytes:
    """Serialize a JSON document (numpy arrays allowed)."""
    return orjson.dumps(obj, option=_NUMPY_OPTS)


def decode_json_object(body: bytes | memoryview) -> dict[str, Any]:
    """Parse a JSON object, raising MalformedRequestError with the parser's reason."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedRequestError(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


def _shape_of(name: str, raw: Any) -> tuple[int, ...]:
    if isinstance(raw, list):
        for d in raw:
            # bool is an int to Python: [true, 64] is no shape
            if type(d) is not int or d < 0:
                break
        else:
            shape = tuple(raw)
            check_shape(name, shape)
            return shape
    raise MalformedRequestError(
        f"input {name!r}: 'shape' must be a list of non-negative integers, got {str(raw)[:80]}"
    )


def check_elements(name: str, shape: tuple[int, ...], available: int) -> int:
    """The element count of ``shape``, refused when the request's ``available`` bytes could
    not hold that many (every element takes at least one byte on any wire), so that no
    size is allocated from a shape alone."""
    count = prod(shape)
    if count > available:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} has {count} elements, more than the "
            f"{available} bytes of the request could carry"
        )
    return count


def _array_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: Any, general: bool = False
) -> np.ndarray:
    """The tensor ``data`` (JSON values) holds; ``general``: without the fast path for floats."""
    if not isinstance(data, list):
        data = [data]
    count = prod(shape)
    if datatype == BYTES:
        try:
            flat = np.asarray(data, dtype=object).reshape(-1)
        except ValueError as exc:  # ragged or deeper than numpy allows
            raise InvalidInputError(f"input {name!r}: data is not a regular array: {exc}") from None
        out = np.empty(flat.size, dtype=object)
        for i, item in enumerate(flat):
            if not isinstance(item, str):
                raise InvalidInputError(
                    f"input {name!r}: BYTES data must be strings, element {i} is {item!r}"
                )
            out[i] = item.encode()
    elif not general and datatype in _FLOATS and type(data[0] if data else None) is float:
        # the common case, in one conversion: JSON numbers into floats. A string, a row of
        # another length, or an overflow is refused as below; a list that begins with a bool
        # (refused when all are) or an int (which may exceed any float) takes the general path
        dtype = oip_to_numpy(datatype)
        try:
            with np.errstate(over="raise"):
                out = np.array(data, dtype=dtype)
        except (ValueError, TypeError, OverflowError, FloatingPointError, RecursionError):
            return _array_from_json(name, datatype, shape, data, general=True)
    else:
        dtype = oip_to_numpy(datatype)
        try:
            probe = np.asarray(data)
        except (ValueError, RecursionError) as exc:  # ragged or too deep
            raise InvalidInputError(f"input {name!r}: data is not a regular array: {exc}") from None
        if not _kind_ok(probe.dtype.kind, dtype.kind):
            raise InvalidInputError(
                f"input {name!r}: data holds {probe.dtype.name} values, which are not valid {datatype}"
            )
        try:
            with np.errstate(over="raise"):
                out = probe.astype(dtype, casting="unsafe").reshape(-1)
        except (ValueError, OverflowError, FloatingPointError) as exc:
            raise InvalidInputError(f"input {name!r}: data is not valid {datatype}: {exc}") from None
        if dtype.kind in "iu" and probe.dtype.kind in "iu" and not np.array_equal(out, probe.reshape(-1)):
            raise InvalidInputError(f"input {name!r}: data overflows {datatype}")
    if out.size != count:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} needs {count} elements, data has {out.size}"
        )
    return out.reshape(shape)


_FLOATS = frozenset(("FP16", "FP32", "FP64"))


def _kind_ok(src: str, dst: str) -> bool:
    """Whether JSON values of numpy kind ``src`` may be stored as kind ``dst`` without loss."""
    if dst == "b":
        return src == "b"
    if dst in "iu":
        return src in "iu"
    if dst in "fV":  # V: bfloat16 from ml_dtypes
        return src in "iuf"
    return src in "iufb"


def flag(params: dict[str, Any], key: str, default: bool = False) -> bool:
    """A boolean request parameter: true/false (JSON or a string), 1/0. Anything else is a 400
    naming it, never a truthy string: ``"false"`` means false."""
    value = params.get(key) if params else None
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise InvalidInputError(f"parameter {key!r} must be true or false, got {value!r}")


def _requested_outputs(doc: dict[str, Any]) -> list[RequestedOutput] | None:
    raw = doc.get("outputs")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise MalformedRequestError("'outputs' must be a list")
    outs: list[RequestedOutput] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MalformedRequestError(f"each requested output needs a 'name', got {item!r}")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise MalformedRequestError(f"output {item['name']!r}: 'parameters' must be an object")
        if "shared_memory_region" in params and flag(params, "binary_data"):
            raise InvalidInputError(
                f"output {item['name']!r}: Output can't set both 'shared_memory_region' and 'binary_data'"
            )
        flag(params, "binary_data")
        if "classification" in params:
            raise InvalidInputError(f"output {item['name']!r}: the classification extension is not supported")
        outs.append(RequestedOutput(item["name"], params))
    return outs


def decode_infer_request(
    body: bytes | bytearray,
    header_length: int | None,
    model_name: str,
    model_version: str,
    shm: SharedMemoryInput | None = None,
) -> InferRequest:
    """Decode an HTTP infer body into an InferRequest. An input whose parameters name a
    ``shared_memory_region`` is read by ``shm`` (None: shared memory is off, a 403).

    Raises MalformedRequestError for undecodable bodies (bad JSON, truncated
    binary data, bad BYTES length prefixes) and InvalidInputError for data that
    does not fit its declared datatype or shape.
    """
    if header_length is None:
        doc = decode_json_object(memoryview(body))
        binary = memoryview(b"")
    else:
        if header_length < 0 or header_length > len(body):
            raise MalformedRequestError(
                f"Inference-Header-Content-Length is {header_length} but the body has {len(body)} bytes"
            )
        view = memoryview(body).toreadonly()  # the arrays read the body, and cannot change it
        doc = decode_json_object(view[:header_length])
        binary = view[header_length:]

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise MalformedRequestError("request needs a non-empty 'inputs' list")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise MalformedRequestError("'parameters' must be an object")
    flag(params, "binary_data_output")  # a bad value is refused before anything runs

    offset = 0
    inputs: list[InferTensor] = []
    for item in raw_inputs:
        if not isinstance(item, dict):
            raise MalformedRequestError(f"each input must be an object, got {item!r}")
        name = item.get("name")
        datatype = item.get("datatype")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise MalformedRequestError(f"each input needs a 'name' and a 'datatype', got {item!r}")
        shape = _shape_of(name, item.get("shape"))
        iparams = item.get("parameters") or {}
        if not isinstance(iparams, dict):
            raise MalformedRequestError(f"input {name!r}: 'parameters' must be an object")
        size = iparams.get("binary_data_size")
        if "shared_memory_region" in iparams:
            if size is not None or "data" in item:
                raise InvalidInputError(
                    f"input {name!r}: Input must set only one of the following fields: 'data', "
                    "'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'"
                )
            if shm is None:
                raise ForbiddenError(
                    f"input {name!r} refers to a shared memory region, but shared memory is off "
                    "on this server (start it with --shared-memory system)"
                )
            data = shm(name, datatype, shape, iparams)
        elif size is not None:
            if not isinstance(size, int) or size < 0:
                raise MalformedRequestError(
                    f"input {name!r}: binary_data_size must be a non-negative integer"
                )
            if offset + size > len(binary):
                raise MalformedRequestError(
                    f"input {name!r}: binary_data_size is {size} but only "
                    f"{len(binary) - offset} bytes of binary data remain (truncated payload?)"
                )
            oip_to_numpy(datatype)  # unknown datatype -> clear error before parsing
            check_elements(name, shape, size)
            data = array_from_raw(name, datatype, shape, binary[offset : offset + size])
            offset += size
        elif "data" in item:
            oip_to_numpy(datatype)
            check_elements(name, shape, len(body))
            data = _array_from_json(name, datatype, shape, item["data"])
            # JSON has no NaN or infinity, and an overflow was refused: nothing to look for
            inputs.append(InferTensor(name, datatype, shape, data, iparams, True))
            continue
        else:
            raise MalformedRequestError(f"input {name!r} has neither 'data' nor binary_data_size")
        inputs.append(InferTensor(name, datatype, shape, data, iparams))
    if offset != len(binary):
        raise MalformedRequestError(
            f"{len(binary) - offset} bytes of binary data follow the inputs that declared them"
        )
    request_id = doc.get("id", "")
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        id=request_id if isinstance(request_id, str) else str(request_id),
        outputs=_requested_outputs(doc),
        parameters=params,
    )


def _json_data(out: InferTensor) -> Any:
    arr = out.data.reshape(-1)
    if out.datatype == BYTES:
        try:
            return [x.decode() if isinstance(x, bytes) else str(x) for x in arr]
        except UnicodeDecodeError:
            raise InvalidInputError(
                f"output {out.name!r} holds bytes that are not UTF-8; request it with binary_data=true"
            ) from None
    if arr.dtype.kind == "V":  # bfloat16 (ml_dtypes): orjson has no encoder for it
        return arr.astype(np.float32)
    return np.ascontiguousarray(arr)


def encode_infer_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """Encode a response. Returns the body and, when binary outputs were used, the
    JSON header length for ``Inference-Header-Content-Length``."""
    default_binary = flag(request.parameters, "binary_data_output")
    # True: binary, False: JSON, None: written to the client's shared memory (no data here)
    per_output: dict[str, bool | None] = {}
    if request.outputs:
        for ro in request.outputs:
            p = ro.parameters
            shm = p and "shared_memory_region" in p
            per_output[ro.name] = None if shm else flag(p, "binary_data", default_binary)

    outputs_json: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for out in response.outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
        if out.parameters:
            entry["parameters"] = dict(out.parameters)
        kind = per_output.get(out.name, default_binary)
        if kind is None:
            pass
        elif kind:
            blob = array_to_raw(out.datatype, out.data)
            entry.setdefault("parameters", {})["binary_data_size"] = len(blob)
            blobs.append(blob)
        else:
            entry["data"] = _json_data(out)
        outputs_json.append(entry)

    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs_json,
    }
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = encode_json(doc)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)
