"""Compact embeddings: FP32 vectors written as int8, uint8 or sign bits, for vector stores
that hold 4 to 32 times more per byte (infinity's ``--embedding-dtype`` types, Cohere's
``embedding_types``).

- ``int8``: each component ``x`` becomes ``round(127 * x / scale)``, clipped to -127..127.
  ``scale`` is the model's: its config's ``pooling.int8_scale`` (the largest magnitude a
  component reaches on a calibration set), or 1.0 for L2-normalised vectors, whose
  components never leave -1..1. One scale for every dimension, so a dot product of two int8
  vectors is ``(127 / scale)^2`` times the FP32 one, and rankings by it are the FP32
  rankings up to rounding.
- ``uint8``: the same integers plus 128 (1..255), for stores that take unsigned bytes.
- ``ubinary``: one bit per dimension, 1 where the component is above 0, packed 8 to a
  byte, the first dimension in the highest bit (``numpy.packbits``); a dimension count that
  is not a multiple of 8 is padded with 0 bits. Compare by Hamming distance.
- ``binary``: the ubinary bytes minus 128, as int8 (sentence-transformers' and infinity's
  ``binary``).

The quantization is applied to the vectors the pipeline returns (after any ``dimensions``
cut and normalisation); the response cache keeps the FP32 vectors, so one cached answer
serves every type.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

__all__ = ["EMBEDDING_TYPES", "EmbeddingType", "calibrate_int8_scale", "quantize"]

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = ("float", "int8", "uint8", "binary", "ubinary")

Array = np.ndarray[Any, Any]


def calibrate_int8_scale(vectors: Array) -> float:
    """The int8 scale for a model whose embeddings look like ``vectors`` [n, dim]: the
    largest magnitude of any component, so that none is clipped."""
    return float(np.abs(np.asarray(vectors, dtype=np.float32)).max())


def quantize(vectors: Array, kind: str, scale: float = 1.0) -> Array:
    """``vectors`` (FP32 [n, dim]) as ``kind``: int8 [n, dim], uint8 [n, dim], binary (int8)
    or ubinary (uint8) [n, ceil(dim / 8)]; float returns them as they are. ValueError for
    another kind or a scale that is not positive."""
    x = np.asarray(vectors, dtype=np.float32)
    if kind == "float":
        return x
    if kind in ("int8", "uint8"):
        if not scale > 0:
            raise ValueError(f"int8 scale must be positive, got {scale!r}")
        q: Array = np.clip(np.rint(x * (127.0 / scale)), -127, 127)
        return q.astype(np.int8) if kind == "int8" else (q + 128).astype(np.uint8)
    if kind in ("binary", "ubinary"):
        bits: Array = np.packbits(x > 0, axis=-1)
        return bits if kind == "ubinary" else (bits.astype(np.int16) - 128).astype(np.int8)
    raise ValueError(f"embedding type must be one of {list(EMBEDDING_TYPES)}, got {kind!r}")
