"""Open Inference Protocol datatypes and their numpy equivalents.

BYTES tensors are numpy object arrays of ``bytes``. BF16 is supported when the
``ml_dtypes`` package is importable (it ships with recent ``onnx``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError

__all__ = [
    "BYTES",
    "OIP_DATATYPES",
    "config_type_to_oip",
    "element_size",
    "numpy_to_oip",
    "oip_to_config_type",
    "oip_to_numpy",
]

BYTES = "BYTES"

_NUMPY: dict[str, Any] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

try:  # optional: BF16 needs ml_dtypes
    import ml_dtypes

    _NUMPY["BF16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    pass

OIP_DATATYPES: frozenset[str] = frozenset(_NUMPY)

_FROM_NUMPY: dict[Any, str] = {dt: name for name, dt in _NUMPY.items()}
# numpy unicode/bytes arrays are sent as BYTES
_FROM_NUMPY_KINDS = {"U": BYTES, "S": BYTES, "O": BYTES}


def oip_to_numpy(datatype: str) -> np.dtype[Any]:
    """Return the numpy dtype for an OIP datatype name.

    Raises InvalidInputError naming the datatype when it is unknown.
    """
    try:
        return _NUMPY[datatype]  # type: ignore[no-any-return]
    except KeyError:
        raise InvalidInputError(
            f"unknown datatype {datatype!r}; expected one of {sorted(OIP_DATATYPES)}"
        ) from None


def numpy_to_oip(dtype: np.dtype[Any]) -> str:
    """Return the OIP datatype name for a numpy dtype."""
    name = _FROM_NUMPY.get(dtype)
    if name is not None:
        return name
    kind = _FROM_NUMPY_KINDS.get(dtype.kind)
    if kind is not None:
        return kind
    raise InvalidInputError(f"numpy dtype {dtype} has no Open Inference Protocol datatype")


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype (BYTES has none: returns 0)."""
    if datatype == BYTES:
        return 0
    return int(oip_to_numpy(datatype).itemsize)


def config_type_to_oip(data_type: str) -> str:
    """Map a Triton config data_type (``TYPE_FP32``, ``TYPE_STRING``) to OIP (``FP32``, ``BYTES``).

    Plain OIP names are accepted too, so native YAML configs may write ``FP32``.
    """
    name = data_type.removeprefix("TYPE_")
    if name == "STRING":
        return BYTES
    if name not in OIP_DATATYPES:
        raise ValueError(
            f"unknown data_type {data_type!r}; expected TYPE_BOOL, TYPE_UINT8..TYPE_UINT64, "
            "TYPE_INT8..TYPE_INT64, TYPE_FP16, TYPE_FP32, TYPE_FP64, TYPE_BF16 or TYPE_STRING"
        )
    return name


def oip_to_config_type(datatype: str) -> str:
    """Map an OIP datatype to its Triton config spelling (``BYTES`` -> ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"
