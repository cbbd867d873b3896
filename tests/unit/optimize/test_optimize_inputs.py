"""What users hand to optimize that the examples never do: a model exported with a fixed
batch of 1, float64 data, and a ``--ship`` that cannot be honoured; and what the report
says its figures hold for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from milliserve.errors import ConfigError
from milliserve.optimize.api import optimize
from milliserve.optimize.report import holds_for
from milliserve.optimize.ship import _quoted


def _mlp(path: Path, batch: int | str, name: str = "x") -> Path:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) * 0.3, "w1"),
        numpy_helper.from_array(rng.standard_normal((32, 3)).astype(np.float32) * 0.3, "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", [name, "w1"], ["h"], name="l1"),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="l2"),
    ]
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _data(tmp_path: Path, rows: int = 50, dtype: type = np.float32) -> Path:
    x = np.random.default_rng(1).standard_normal((rows, 16)).astype(dtype)
    np.savez(tmp_path / "eval.npz", x=x)
    return tmp_path / "eval.npz"


def test_a_model_with_a_fixed_batch_of_one_is_scored_and_timed_at_that_batch(tmp_path: Path) -> None:
    source = _mlp(tmp_path / "static.onnx", 1)
    out = tmp_path / "repo" / "static"
    report = optimize(
        source, _data(tmp_path), out, metric="cosine", only=["fp32", "int8_dynamic"], rounds=2, final_rounds=3
    )
    assert report.batches == [1] and report.winner is not None
    rows = {r["name"]: r for r in report.rows}
    assert rows["int8_dynamic"]["quality"] > 0.95 and "p50_b8_us" not in rows["fp32"]
    assert "max_batch_size: 0" in (out / "config.pbtxt").read_text()


def test_float64_data_is_named_before_anything_runs(tmp_path: Path) -> None:
    source = _mlp(tmp_path / "m.onnx", "b")
    with pytest.raises(ConfigError, match="holds float64 but the model takes float32"):
        optimize(source, _data(tmp_path, dtype=np.float64), tmp_path / "repo" / "m", metric="cosine")


def test_a_ship_that_cannot_be_honoured_says_why_and_keeps_the_report(tmp_path: Path) -> None:
    source = _mlp(tmp_path / "m.onnx", "b")
    out = tmp_path / "repo" / "m"
    with pytest.raises(ConfigError, match=r"it was not built .*calibration"):
        optimize(
            source,
            _data(tmp_path),
            out,
            metric="cosine",
            only=["fp32", "int8_static_minmax"],
            rounds=1,
            final_rounds=1,
            ship="int8_static_minmax",
        )
    report = json.loads((out / "report.json").read_text())
    assert report["winner"] is None and report["why"].startswith("nothing shipped")
    assert not (out / "1").exists()


def test_a_ship_below_the_tolerance_is_refused_and_keeps_the_report(tmp_path: Path) -> None:
    """The quality gate of ``--ship``, on any CPU: with no tolerance at all, an INT8 variant
    (whose outputs always differ a little from FP32's) is below FP32 minus the tolerance."""
    source = _mlp(tmp_path / "m.onnx", "b")
    out = tmp_path / "repo" / "m"
    with pytest.raises(ConfigError, match=r"--ship 'int8_dynamic': its quality .* is below FP32 minus"):
        optimize(
            source,
            _data(tmp_path),
            out,
            metric="cosine",
            tolerance=0.0,
            only=["fp32", "int8_dynamic"],
            rounds=1,
            final_rounds=1,
            budget_s=0.0,  # no accuracy-aware search: the plain INT8 variant is the one asked for
            ship="int8_dynamic",
        )
    report = json.loads((out / "report.json").read_text())
    assert report["winner"] is None and report["why"].startswith("nothing shipped")
    row = next(r for r in report["rows"] if r["name"] == "int8_dynamic")
    assert row["quality"] < report["reference"]
    assert not (out / "1").exists()


def test_the_report_says_which_cpu_features_its_figures_hold_for(tmp_path: Path) -> None:
    source = _mlp(tmp_path / "m.onnx", "b")
    out = tmp_path / "repo" / "m"
    report = optimize(source, _data(tmp_path), out, metric="cosine", only=["fp32"], rounds=1, final_rounds=1)
    text = (out / "report.md").read_text()
    flags = " ".join(report.cpu["flags"]) or "none of AVX2, AVX-512, VNNI, BF16 or AMX"
    assert f"Accuracy and speed hold for a CPU with these features: {flags}." in text
    assert holds_for({"flags": []}).startswith(
        "Accuracy and speed hold for a CPU with these features: none of AVX2"
    )


def test_tensor_names_with_quotes_are_escaped_in_the_config() -> None:
    assert _quoted('a"b\\c') == 'a\\"b\\\\c'
