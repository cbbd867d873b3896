"""Compact embedding types (runtime/embedding_types.py): the exact quantization of each
type, as docs/embeddings.md states it, and that int8 keeps the FP32 ranking."""

from __future__ import annotations

import numpy as np
import pytest

from milliserve.runtime.embedding_types import calibrate_int8_scale, quantize

X = np.array([[0.5, -0.25, 0.0, 1.0, -1.0, 0.001, -0.001, 0.3, 0.2]], dtype=np.float32)


def test_int8_and_uint8_are_one_grid() -> None:
    q = quantize(X, "int8")
    assert q.dtype == np.int8
    assert q.tolist() == [[64, -32, 0, 127, -127, 0, 0, 38, 25]]
    u = quantize(X, "uint8")
    assert u.dtype == np.uint8
    assert u.tolist() == [[v + 128 for v in q[0].tolist()]]
    # a calibrated scale: 0.5 maps to 127, larger components are clipped
    assert quantize(X, "int8", 0.5)[0, :5].tolist() == [127, -64, 0, 127, -127]


def test_binary_packs_sign_bits_first_dimension_highest() -> None:
    bits = quantize(X, "ubinary")
    # > 0: 1, 0, 0, 1, 0, 1, 0, 1 | 1 (then 7 padding zeros)
    assert bits.dtype == np.uint8 and bits.tolist() == [[0b10010101, 0b10000000]]
    signed = quantize(X, "binary")
    assert signed.dtype == np.int8 and signed.tolist() == [[0b10010101 - 128, 0b10000000 - 128]]
    assert quantize(X, "float") is not None and quantize(X, "float").dtype == np.float32


def test_int8_keeps_the_ranking_of_unit_vectors() -> None:
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(200, 64)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    query = docs[0] + 0.3 * docs[1]
    scale = calibrate_int8_scale(docs)
    assert scale == pytest.approx(float(np.abs(docs).max()))
    exact = np.argsort(-(docs @ query))[:10]
    q = quantize(docs, "int8", scale).astype(np.int32)
    approx = np.argsort(-(q @ quantize(query[None], "int8", scale)[0].astype(np.int32)))[:10]
    assert len(set(exact.tolist()) & set(approx.tolist())) >= 9


def test_bad_type_or_scale() -> None:
    with pytest.raises(ValueError, match="'int4'"):
        quantize(X, "int4")
    with pytest.raises(ValueError, match="positive"):
        quantize(X, "int8", 0.0)
