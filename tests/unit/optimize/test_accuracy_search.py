"""The accuracy-aware INT8 search: measured damage ranks the nodes, and the smallest
prefix that restores the metric is found, within the time budget."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from milliserve.optimize.accuracy_search import restore_search
from milliserve.optimize.api import optimize
from milliserve.optimize.progress import quiet


def test_the_smallest_restoring_prefix_is_found_by_measured_damage(tmp_path: Path) -> None:
    """Ten nodes; the outlier heuristic (prior order) puts the two that matter last."""
    nodes = [f"n{i}" for i in range(10)]
    harm = {n: 0.001 for n in nodes} | {"n8": 0.05, "n9": 0.04, "n0": 0.002}
    built: dict[Path, list[str]] = {}

    def build(keep: list[str], only: str | None) -> Path:
        path = tmp_path / f"m{len(built)}"
        built[path] = [only] if only else [n for n in nodes if n not in keep]  # the quantized nodes
        return path

    def score(path: object) -> float:
        return 0.90 - sum(harm[n] for n in built[path])  # type: ignore[index]

    def damage(path: object) -> float:
        return sum(harm[n] for n in built[path]) ** 2  # type: ignore[index]

    found = restore_search(build, nodes, score, damage, target=0.89, budget_s=60, progress=quiet, label="t")
    assert found.kept == ["n8", "n9"] and found.quality >= 0.89  # the other eight cost 0.009
    assert found.ranked == 10
    restore_steps = [s for s in found.steps if s.what.startswith("keep")]
    assert [s.kept_fp32 for s in restore_steps][:2] == [1, 2]


def test_the_search_stops_at_its_budget(tmp_path: Path) -> None:
    nodes = [f"n{i}" for i in range(50)]

    def build(keep: list[str], only: str | None) -> Path:
        time.sleep(0.02)
        return tmp_path / "m"

    started = time.monotonic()
    found = restore_search(
        build, nodes, lambda _: 0.0, lambda _: 1.0, 0.5, budget_s=0.3, progress=quiet, label="t"
    )
    assert found.kept is None and found.ranked < 50
    assert time.monotonic() - started < 0.3 + 1.5  # one step may finish after the deadline


def _outlier_mlp(path: Path, op: str = "MatMul") -> Path:
    """x[:, 0] is ~1000x the other features: dynamic INT8 of the first layer (one scale for
    the whole activation) rounds the other 31 features away; the later layers are harmless."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 64)).astype(np.float32) * 0.2
    w1[0] *= 1e-3
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32) * 0.15, "w2"),
        numpy_helper.from_array(rng.standard_normal((64, 4)).astype(np.float32) * 0.15, "w3"),
    ]
    nodes = [
        helper.make_node(op, ["x", "w1"], ["h1"], name="layer1"),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node(op, ["r1", "w2"], ["h2"], name="layer2"),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node(op, ["r2", "w3"], ["logits"], name="layer3"),
    ]
    graph = helper.make_graph(
        nodes,
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 4])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])  # Gemm: what nn.Linear exports to
def test_dynamic_int8_out_of_tolerance_keeps_the_damaging_layer_in_fp32(tmp_path: Path, op: str) -> None:
    source = _outlier_mlp(tmp_path / "mlp.onnx", op)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((600, 32)).astype(np.float32)
    x[:, 0] *= 1000
    np.savez(tmp_path / "eval.npz", x=x)
    report = optimize(
        source,
        tmp_path / "eval.npz",
        tmp_path / "repo" / "mlp",
        metric="cosine",
        tolerance=0.001,
        only=["fp32", "int8_dynamic"],
        rounds=2,
        batches=(1,),
        final_rounds=3,
        budget_s=60,
    )
    rows = {r["name"]: r for r in report.rows}
    assert rows["int8_dynamic"]["delta"] < -0.001  # plain dynamic INT8 is out of tolerance
    acc = rows["int8_dynamic_acc"]
    assert not acc["skipped"] and acc["delta"] >= -0.001
    assert "1 of 3 weight nodes kept in FP32" in acc["note"] and "layer1" in acc["note"]
    assert acc["search"][0]["what"].startswith("quantize only") and any(
        s["what"] == "keep the 1 worst in FP32" for s in acc["search"]
    )
    md = (tmp_path / "repo" / "mlp" / "report.md").read_text()
    assert "### Accuracy-aware search: int8_dynamic_acc" in md
