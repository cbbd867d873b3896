"""optimize's ``embedding`` metric: mean cosine and recall@10 to FP32's vectors, the gate
they make together, and an optimize run that records both for every variant (issue 63)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from milliserve.errors import ConfigError
from milliserve.optimize.api import optimize
from milliserve.optimize.measure import EvalSet, embedding_measures, score

Array = np.ndarray[Any, Any]


def _unit(x: Array) -> Array:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _exact_recall(got: Array, ref: Array, k: int = 10) -> float:
    """Recall@k written the plain way: full sorts, own row dropped from both lists."""
    shares = []
    for i in range(len(ref)):
        mine = [j for j in np.argsort(-(ref @ got[i]), kind="stable") if j != i][:k]
        truth = [j for j in np.argsort(-(ref @ ref[i]), kind="stable") if j != i][:k]
        shares.append(len(set(mine) & set(truth)) / k)
    return float(np.mean(shares))


def test_fp32_against_itself_is_perfect() -> None:
    ref = np.random.default_rng(0).standard_normal((60, 16)).astype(np.float32)
    m = embedding_measures(ref, EvalSet({"x": ref}), ref)
    assert (
        m["cosine"] == pytest.approx(1.0) and m["recall_at_10"] == 1.0 and m["quality"] == pytest.approx(1.0)
    )


def test_cosine_and_recall_match_a_plain_computation() -> None:
    rng = np.random.default_rng(1)
    ref = _unit(rng.standard_normal((150, 24)))
    got = ref + 0.08 * rng.standard_normal(ref.shape)  # vectors not normalised: the metric does it
    m = embedding_measures(got, EvalSet({"x": got}), ref)
    cos = np.mean(np.sum(_unit(got) * ref, axis=1))
    assert m["cosine"] == pytest.approx(cos, abs=1e-12)
    assert m["recall_at_10"] == pytest.approx(_exact_recall(_unit(got), ref))
    assert 0 < m["recall_at_10"] < 1  # the noise moves some neighbours
    assert m["quality"] == pytest.approx(min(m["cosine"], 1 - (1 - m["recall_at_10"]) / 3))


def test_the_gate_needs_both_cosine_and_recall() -> None:
    """quality >= 1 - t exactly when cosine >= 1 - t and recall@10 >= 1 - 3t."""
    rng = np.random.default_rng(2)
    ref = _unit(rng.standard_normal((300, 32)))
    for noise in (0.005, 0.02, 0.05, 0.1, 0.2):
        got = ref + noise * rng.standard_normal(ref.shape)
        m = embedding_measures(got, EvalSet({"x": got}), ref)
        for t in (0.005, 0.01, 0.02):
            both = m["cosine"] >= 1 - t and m["recall_at_10"] >= 1 - 3 * t
            assert (m["quality"] >= 1 - t) == both, (noise, t, m)
    # a high cosine does not carry a ranking that moved: neighbours of a dense cluster swap
    close = _unit(np.ones((40, 8)) + 0.01 * rng.standard_normal((40, 8)))
    moved = close + 0.01 * rng.standard_normal(close.shape)
    m = embedding_measures(moved, EvalSet({"x": moved}), close)
    assert m["cosine"] > 0.999 and m["recall_at_10"] < 0.97 and m["quality"] < 0.99


def test_token_embeddings_are_mean_pooled_over_the_mask() -> None:
    rng = np.random.default_rng(3)
    tokens = rng.standard_normal((30, 6, 8)).astype(np.float32)
    mask = (np.arange(6)[None, :] < rng.integers(1, 7, (30, 1))).astype(np.int64)
    other = tokens.copy()
    other[mask == 0] = 1000.0  # padding differs wildly: pooling must not see it
    data = EvalSet({"input_ids": np.zeros((30, 6), np.int64), "attention_mask": mask})
    m = embedding_measures(other, data, tokens)
    assert m["cosine"] == pytest.approx(1.0) and m["recall_at_10"] == 1.0
    assert score("embedding", other, data, tokens) == pytest.approx(1.0)
    assert score("cosine", other, data, tokens) < 0.9  # flattened, the padding counts


@pytest.mark.parametrize(
    ("outputs", "inputs", "message"),
    [
        (np.ones((20, 4, 3)), {"x": np.ones((20, 4))}, "needs an 'attention_mask'"),
        (np.ones((20, 2, 4, 3)), {"x": np.ones((20, 4))}, "not outputs of shape [20, 2, 4, 3]"),
        (np.ones((10, 3)), {"x": np.ones((10, 4))}, "needs more than 10 EVAL rows"),
    ],
)
def test_what_the_metric_cannot_measure_is_named(
    outputs: Array, inputs: dict[str, Array], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        embedding_measures(outputs, EvalSet(inputs), outputs)


def _embedder(path: Path, dim_in: int = 64, dim_out: int = 48) -> None:
    """A small embedding model: x @ W then tanh, with weights a quantizer will round."""
    w = np.random.default_rng(4).standard_normal((dim_in, dim_out)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
            helper.make_node("Tanh", ["h"], ["embedding"], name="act"),
        ],
        "embedder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim_in])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", dim_out])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_optimize_records_cosine_and_recall_and_ships_by_the_rule(tmp_path: Path) -> None:
    _embedder(tmp_path / "model.onnx")
    x = np.random.default_rng(5).standard_normal((200, 64)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x)
    report = optimize(
        tmp_path / "model.onnx",
        tmp_path / "eval.npz",
        tmp_path / "repo" / "embedder",
        metric="embedding",
        only=["fp32", "ort_optimized", "int8_dynamic"],
        batches=(1, 8),
        rounds=2,
        final_rounds=3,
        budget_s=0,
    )
    assert report.metric == "embedding" and report.reference == pytest.approx(1.0)
    rows = {r["name"]: r for r in report.rows if not r["skipped"]}
    assert {"fp32", "int8_dynamic"} <= set(rows)
    for name, r in rows.items():
        m = r["measures"]
        assert set(m) == {"cosine", "recall_at_10", "quality"}, name
        assert (
            r["quality"] == m["quality"] == pytest.approx(min(m["cosine"], 1 - (1 - m["recall_at_10"]) / 3))
        )
    assert rows["fp32"]["measures"]["recall_at_10"] == 1.0
    # the rule, whichever variant this CPU's kernels make fastest: what ships meets both gates
    shipped = rows[report.winner or "fp32"]["measures"]
    assert shipped["cosine"] >= 0.99 and shipped["recall_at_10"] >= 0.97
    saved = json.loads((tmp_path / "repo" / "embedder" / "report.json").read_text())
    assert {r["name"]: r.get("measures") for r in saved["rows"] if not r["skipped"]} == {
        n: r["measures"] for n, r in rows.items()
    }
    markdown = (tmp_path / "repo" / "embedder" / "report.md").read_text()
    assert "### Embedding quality" in markdown and "| int8_dynamic | " in markdown
