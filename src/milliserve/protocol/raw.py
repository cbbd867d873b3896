"""Raw tensor bytes: the layout shared by the HTTP binary tensor extension and gRPC
``raw_input_contents`` / ``raw_output_contents``.

Fixed-size datatypes are little-endian, row-major. BYTES elements are each a
4-byte little-endian length followed by that many bytes.
"""

from __future__ import annotations

import struct
from math import prod
from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError, MalformedRequestError
from milliserve.protocol.datatypes import BYTES, oip_to_numpy

__all__ = [
    "MAX_DIMS",
    "array_from_raw",
    "array_to_raw",
    "check_shape",
    "deserialize_bytes",
    "serialize_bytes",
]

_LEN = struct.Struct("<I")
# numpy arrays have at most 32 dims
MAX_DIMS = 32
# no tensor has more elements than this (2**48: 256 TB of bytes), whatever its zero dims say
_MAX_ELEMENTS = 1 << 48


def check_shape(name: str, shape: tuple[int, ...]) -> None:
    """Refuse a shape no tensor can have: negative or too many dims, or dims whose product
    (zero dims aside) is beyond any memory, before anything is sized from it."""
    if len(shape) > MAX_DIMS:
        raise InvalidInputError(f"input {name!r}: shape has {len(shape)} dims; at most {MAX_DIMS}")
    total = 1  # of the non-zero dims: one loop, as this runs on every request
    for d in shape:
        if d < 0:
            raise InvalidInputError(f"input {name!r}: shape {list(shape)} has negative dims")
        if d:
            total *= d
    if total > _MAX_ELEMENTS:
        raise InvalidInputError(f"input {name!r}: shape {list(shape)} is larger than any tensor can be")


def deserialize_bytes(name: str, buf: bytes | memoryview, count: int) -> np.ndarray[Any, Any]:
    """Parse ``count`` length-prefixed BYTES elements from ``buf`` into an object array.

    Raises MalformedRequestError naming the tensor when a prefix runs past the
    buffer, when elements are missing, or when bytes are left over.
    """
    view = memoryview(buf)
    total = len(view)
    # every element needs its 4-byte length prefix: check before allocating count objects
    if count * 4 > total:
        raise MalformedRequestError(
            f"input {name!r}: {count} BYTES elements need at least {count * 4} bytes (a 4-byte "
            f"length each), but the tensor has {total}"
        )
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > total:
            raise MalformedRequestError(
                f"input {name!r}: BYTES element {i} has no length prefix "
                f"(expected {count} elements, buffer ends at byte {total})"
            )
        (length,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + length > total:
            raise MalformedRequestError(
                f"input {name!r}: BYTES element {i} declares length {length} "
                f"but only {total - pos} bytes remain"
            )
        out[i] = bytes(view[pos : pos + length])
        pos += length
    if pos != total:
        raise MalformedRequestError(
            f"input {name!r}: {total - pos} bytes left over after {count} BYTES elements"
        )
    return out


def serialize_bytes(arr: np.ndarray[Any, Any]) -> bytes:
    """Serialize an array of bytes/str elements as length-prefixed BYTES."""
    parts: list[bytes] = []
    for item in arr.reshape(-1):
        b = item.encode() if isinstance(item, str) else bytes(item)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def array_from_raw(
    name: str, datatype: str, shape: tuple[int, ...], buf: bytes | memoryview
) -> np.ndarray[Any, Any]:
    """Build the numpy array for a tensor from its raw bytes, checking the size first."""
    check_shape(name, shape)
    count = prod(shape)
    if datatype == BYTES:
        return deserialize_bytes(name, buf, count).reshape(shape)
    dtype = oip_to_numpy(datatype)
    expected = count * dtype.itemsize
    if len(buf) != expected:
        raise MalformedRequestError(
            f"input {name!r}: {len(buf)} bytes of raw data, but shape {list(shape)} "
            f"of {datatype} needs {expected}"
        )
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def array_to_raw(datatype: str, arr: np.ndarray[Any, Any]) -> bytes:
    """The raw bytes of an output array in the wire layout."""
    if datatype == BYTES:
        return serialize_bytes(arr)
    return np.ascontiguousarray(arr).tobytes()
