"""``edge build --webgpu --fp16``'s half-precision copy (edge/webgpu.py): made and checked
against the FP32 model with ONNX Runtime, and refused in words when ONNX Runtime's float16
converter makes a copy that does not load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from milliserve.edge.webgpu import half_model
from milliserve.errors import ConfigError


def _model(path: Path, op: str) -> Path:
    """y = op(x @ W), x [batch, 8]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node(op, ["h"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_fp32_model_gets_a_checked_half_copy(tmp_path: Path) -> None:
    half = half_model(_model(tmp_path / "relu.onnx", "Relu"), tmp_path, "fp32")
    assert half["precision"] == "fp16" and 0 < half["max_abs_diff"] < 1e-2
    assert (tmp_path / half["file"]).stat().st_size == half["bytes"]


def test_a_copy_onnx_runtime_cannot_load_is_refused_in_words(tmp_path: Path) -> None:
    # Celu is defined for float only: the converter makes it FP16 all the same, and the copy
    # does not load (so does a graph saved after ONNX Runtime's offline fusions)
    with pytest.raises(ConfigError, match=r"its FP16 copy.* does not load .*drop --fp16"):
        half_model(_model(tmp_path / "celu.onnx", "Celu"), tmp_path, "fp32")
    assert not list(tmp_path.glob("model_half.*"))


def test_a_quantized_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--fp16 converts an FP32 model"):
        half_model(_model(tmp_path / "relu.onnx", "Relu"), tmp_path, "int8 (dynamic)")
