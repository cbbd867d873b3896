"""Calibration on a graph whose attention mask adds -inf (Entropy and Percentile used to
crash on it), and a Pareto plot whose labels do not overlap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from milliserve.optimize.graph_prep import clamp_nonfinite
from milliserve.optimize.measure import EvalSet, predict
from milliserve.optimize.report import OptimizeReport, _place_labels
from milliserve.optimize.static_int8 import static_search


def _masked_attention(path: Path) -> Path:
    """x [b, 8, 16] -> scores = x·Wq · (x·Wk)^T + mask (-inf on the last 3 keys) -> softmax -> ·x·Wv."""
    rng = np.random.default_rng(0)
    mask = np.zeros((1, 1, 8), np.float32)
    mask[..., -3:] = -np.inf
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) * 0.3, n)
        for n in ("wq", "wk", "wv")
    ] + [numpy_helper.from_array(mask, "mask")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Add", ["s", "mask"], ["sm"], name="add_mask"),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="context"),
    ]
    graph = helper.make_graph(
        nodes,
        "masked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8, 16])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_entropy_and_percentile_calibrate_a_graph_whose_mask_adds_minus_inf(tmp_path: Path) -> None:
    source = _masked_attention(tmp_path / "masked.onnx")
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((4, 8, 16)).astype(np.float32)} for _ in range(4)]
    clamped, n, fp32_nodes = clamp_nonfinite(source, tmp_path / "finite.onnx", calib)
    assert n == 1 and clamped != source  # one constant held -inf; outputs unchanged (checked inside)
    assert fp32_nodes[0] == "add_mask" and len(fp32_nodes) == 2  # the sum spans [-1e4, x], and its softmax
    variants = {v.name: v for v in static_search(source, tmp_path / "out", calib, scorer=None)}
    for name in ("int8_static_minmax", "int8_static_entropy", "int8_static_percentile"):
        assert variants[name].path is not None, variants[name].skipped
        assert "clamped to ±1e4 for calibration" in variants[name].note
    data = EvalSet({"x": rng.standard_normal((16, 8, 16)).astype(np.float32)})
    ref = predict(source, data)
    got = predict(variants["int8_static_entropy"].path, data)  # type: ignore[arg-type]
    assert np.isfinite(got).all() and np.abs(got - ref).mean() < 0.1 * np.abs(ref).mean() + 0.05


def test_a_graph_without_infinities_is_left_alone(tmp_path: Path, example_repo: Path) -> None:
    source = example_repo / "fraud_mlp" / "1" / "model.onnx"
    assert clamp_nonfinite(source, tmp_path / "f.onnx", []) == (source, 0, [])
    assert not (tmp_path / "f.onnx").exists()


def test_pareto_labels_do_not_overlap(tmp_path: Path) -> None:
    from milliserve.plotting import pyplot

    plt = pyplot("test")
    # twelve variants crowded around the same latency and quality, as INT8 variants are, and
    # six at exactly FP32's point (lossless variants), one at the right edge
    names = [f"int8_static_variant_{i}" for i in range(12)] + [f"lossless_{i}" for i in range(6)]
    pts = [(100 + i * 0.5, 0.90 + (i % 3) * 0.0005, n) for i, n in enumerate(names[:12])]
    pts += [(20.0, 0.9824, n) for n in names[12:]] + [(1000.0, 0.95, "openvino_bf16_at_the_edge")]
    fig, ax = plt.subplots(figsize=(10, 6))
    ax.set_xscale("log")
    ax.scatter([p[0] for p in pts], [p[1] for p in pts])
    fig.canvas.draw()
    texts = _place_labels(ax, pts, fig)
    renderer = fig.canvas.get_renderer()
    from matplotlib.text import Text

    fig.canvas.draw()
    boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the words, not the leader lines
    n = len(pts)
    assert len(boxes) == n == 19
    overlaps = [(i, j) for i in range(n) for j in range(i + 1, n) if boxes[i].overlaps(boxes[j])]
    assert not overlaps
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes)  # none cut off at the edge
    plt.close(fig)


def test_the_report_marks_the_shipped_variant(tmp_path: Path) -> None:
    from milliserve.optimize.report import write_reports

    rows = [
        {
            "name": n,
            "note": "",
            "skipped": "",
            "runtime": "onnxruntime",
            "servable": True,
            "search": [],
            "quality": q,
            "delta": q - 0.9,
            "size_bytes": 1024,
            "p50_b1_us": t,
            "p99_b1_us": t * 1.5,
            "speedup": 100 / t,
            "speedup_low": 90 / t,
            "speedup_high": 110 / t,
        }
        for n, q, t in (("fp32", 0.9, 100.0), ("int8_dynamic", 0.899, 40.0), ("fp16", 0.9, 104.0))
    ]
    report = OptimizeReport(
        "m.onnx",
        "accuracy",
        0.01,
        "p50_b1_us",
        {"model": "cpu", "cores": 2, "flags": []},
        1,
        0.9,
        rows=rows,
        winner="int8_dynamic",
        why="int8_dynamic: 2.50× FP32",
        pareto=["fp32", "int8_dynamic"],
        batches=[1],
    )
    write_reports(report, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| int8_dynamic **shipped** |" in md and "2.50× (2.25–2.75)" in md
    assert (tmp_path / "pareto.png").stat().st_size > 10_000
    rows[2]["speedup_low"] = float("nan")  # no interval: null in strict JSON
    write_reports(report, tmp_path)
    import json

    assert (
        json.loads((tmp_path / "report.json").read_text(), parse_constant=lambda c: 1 / 0)["rows"][2][
            "speedup_low"
        ]
        is None
    )
