"""NNCF INT4 on a model whose input width 32 does not divide (a 120-feature tabular MLP)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from milliserve.optimize.measure import EvalSet, ModelRef, predict
from milliserve.optimize.openvino_variants import _nncf_int4


def test_int4_falls_back_to_per_channel_groups_when_32_does_not_divide(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((120, 64)).astype(np.float32) * 0.1, "w1"),
        numpy_helper.from_array(rng.standard_normal((64, 3)).astype(np.float32) * 0.1, "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 120])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])],
        inits,
    )
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    variant = _nncf_int4(source, tmp_path / "int4.xml")
    assert variant.path is not None and "per output channel" in variant.note
    data = EvalSet({"x": rng.standard_normal((8, 120)).astype(np.float32)})
    got = predict(ModelRef(variant.path, "openvino", "f32"), data)
    assert got.shape == (8, 3) and np.isfinite(got).all()
