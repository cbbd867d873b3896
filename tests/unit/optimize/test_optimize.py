"""milliserve optimize on the example fraud MLP: variants, selection, the shipped repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from milliserve.errors import ConfigError
from milliserve.examples.fraud_mlp import synthetic_transactions
from milliserve.optimize.api import optimize
from milliserve.optimize.cpu import cpu_info
from milliserve.optimize.measure import EvalSet, predict
from milliserve.optimize.select import Candidate, pareto_front, select, speedup_interval, suggest_batching
from milliserve.optimize.variants import build_variants
from milliserve.testing import ServerProcess


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("opt-data")
    x, y = synthetic_transactions(1500, seed=11)
    np.savez(d / "eval.npz", features=x, labels=y)
    np.savez(d / "calib.npz", features=x[:256])
    return d / "eval.npz", d / "calib.npz"


def test_each_variant_stays_close_to_fp32(example_repo: Path, tmp_path: Path) -> None:
    source = example_repo / "fraud_mlp" / "1" / "model.onnx"
    x, _ = synthetic_transactions(300, seed=5)
    calib = [{"features": x[i : i + 16]} for i in range(0, 128, 16)]
    variants = build_variants(source, tmp_path, cpu_info(), calib)
    assert {v.name for v in variants if v.path} >= {
        "fp32",
        "ort_optimized",
        "fp16",
        "int8_dynamic",
        "int8_static_minmax",
        "int8_static_entropy",
        "int8_static_percentile",
    }
    data = EvalSet({"features": x})
    ref = predict(source, data)
    tolerance = {"fp32": 1e-6, "ort_optimized": 1e-5, "fp16": 1e-2, "nncf_int4": 0.25}
    skipped = {v.name: v.skipped for v in variants if v.path is None}
    assert skipped["bert_fused"] == "no BERT-like attention found to fuse"
    assert skipped["int4_weight_only"].startswith("no MatMul with a constant weight")  # fraud_mlp is Gemm
    assert set(skipped) <= {"bert_fused", "int4_weight_only", "openvino_f32", "openvino_bf16", "nncf_int8"}, (
        skipped
    )
    for v in variants:
        if v.path is None:
            continue
        got = predict(v.ref, data)
        atol = tolerance.get(v.name, 0.1)  # INT8 variants: probabilities within 0.1
        np.testing.assert_allclose(got, ref, atol=atol, err_msg=v.name)


def test_static_int8_without_calibration_is_skipped_with_a_reason(example_repo: Path, tmp_path: Path) -> None:
    source = example_repo / "fraud_mlp" / "1" / "model.onnx"
    variants = build_variants(source, tmp_path, cpu_info(), None, only=["fp32", "int8_static_minmax"])
    skipped = {v.name: v.skipped for v in variants}
    assert skipped["fp32"] == "" and "needs calibration data" in skipped["int8_static_minmax"]


def _rounds(
    us: float, n: int = 12, spread: float = 0.02, burst: dict[int, float] | None = None, seed: int = 0
) -> list[list[float]]:
    """``n`` rounds of 50 calls around ``us`` µs; ``burst`` slows chosen rounds (machine load)."""
    rng = np.random.default_rng(seed)
    return [
        list(us * 1e-6 * (burst or {}).get(r, 1.0) * (1 + spread * rng.standard_normal(50)).clip(0.5))
        for r in range(n)
    ]


def _cand(name: str, quality: float, rounds: list[list[float]]) -> Candidate:
    flat = [x for r in rounds for x in r]
    timing = {"p50_b1_us": float(np.median(flat) * 1e6), "p99_b1_us": float(np.percentile(flat, 99) * 1e6)}
    return Candidate(name, quality, timing, rounds={1: rounds})


def test_selection_ships_the_fastest_within_tolerance_when_it_beats_the_noise() -> None:
    cands = [
        _cand("fp32", 0.90, _rounds(100, seed=1)),
        _cand("int8", 0.895, _rounds(40, seed=2)),
        _cand("int8_bad", 0.80, _rounds(30, seed=3)),
        _cand("fp16", 0.90, _rounds(120, seed=4)),
    ]
    chosen = select(cands, 0.90, 0.01)
    assert chosen.winner is not None and chosen.winner.name == "int8"
    p, lo, hi = chosen.intervals["int8"]
    assert 2.3 < lo <= p <= hi < 2.7 and "95% CI" in chosen.reason
    nothing_faster = select(cands, 0.90, 0.001)
    assert nothing_faster.winner is not None and nothing_faster.winner.name == "fp32"
    assert "no variant within tolerance" in nothing_faster.reason
    assert select(cands, 0.99, 0.0).winner is None
    assert pareto_front(cands, "p50_b1_us") == ["fp32", "int8", "int8_bad"]
    curve = {"p50_b1_us": 10.0, "p50_b8_us": 20.0, "p50_b32_us": 70.0}
    # per item: 10, 2.5 and 2.19 µs; 8 is within 20% of the best, and the smallest such batch
    assert suggest_batching(curve) == {"preferred_batch_size": [8], "max_queue_delay_microseconds": 50}


def test_selection_does_not_ship_noise() -> None:
    """The issue's case: FP16 is really 0.94x FP32, but a burst of load hit FP32 in some rounds
    and FP16 in none. Ranking on a pooled p99 shipped FP16; the paired interval does not."""
    burst = {2: 3.0, 7: 2.5, 9: 2.0}
    fp32 = _rounds(100, spread=0.05, burst=burst, seed=5)
    fp16 = _rounds(106, spread=0.05, seed=6)
    cands = [
        _cand("fp32", 0.90, fp32),
        _cand("fp16", 0.90, fp16),
        _cand("ort_optimized", 0.90, _rounds(101, spread=0.05, seed=7)),
    ]
    assert cands[1].latency("p99_b1_us") < cands[0].latency("p99_b1_us")  # what fooled the old selection
    chosen = select(cands, 0.90, 0.01, "p99_b1_us")
    assert chosen.winner is not None and chosen.winner.name in ("fp32", "ort_optimized")
    assert chosen.key == "p50_b1_us" and "fewer than the 1000" in chosen.reason  # 600 calls: no p99


def test_speedup_interval_is_paired_by_round() -> None:
    """A slow round for both variants cancels out of the ratio; it does not widen the interval."""
    burst = {r: 1 + r / 4 for r in range(12)}  # the machine gets slower and slower
    a, b = _rounds(100, burst=burst, seed=8), _rounds(50, burst=burst, seed=9)
    p, lo, hi = speedup_interval(a, b)
    assert 1.9 < lo <= p <= hi < 2.1
    assert np.isnan(speedup_interval(a[:2], b[:2])[1])  # two rounds: no interval


def test_cli_ships_a_repository_that_milliserve_serves(
    example_repo: Path, data: tuple[Path, Path], tmp_path: Path
) -> None:
    eval_path, calib = data
    out = tmp_path / "repo" / "fraud_opt"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "milliserve",
            "optimize",
            str(example_repo / "fraud_mlp" / "1" / "model.onnx"),
            "--eval",
            str(eval_path),
            "--calibration",
            str(calib),
            # every variant, timed briefly: the test is about what ships and serves, not which wins
            "--batches",
            "1,8",
            "--rounds",
            "2",
            "--final-rounds",
            "5",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for name in ("report.md", "report.json", "pareto.png", "config.pbtxt", "1/model.onnx"):
        assert (out / name).is_file(), name
    md = (out / "report.md").read_text()
    assert "| int8_dynamic" in md
    # the timed inputs' size is said: a speed-up holds for inputs of that size and those threads
    assert "features [batch, 64]" in md and "1 inference thread(s)" in md
    x, _ = synthetic_transactions(4, seed=1)
    expected = predict(out / "1" / "model.onnx", EvalSet({"features": x}))
    with ServerProcess(out.parent) as server, httpclient.InferenceServerClient(server.http_url) as client:
        inp = httpclient.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("fraud_opt", [inp]).as_numpy("probabilities")
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_bad_inputs_are_named(example_repo: Path, data: tuple[Path, Path], tmp_path: Path) -> None:
    source = example_repo / "fraud_mlp" / "1" / "model.onnx"
    eval_path, _ = data
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, features=np.zeros((4, 63), np.float32), labels=np.zeros(4))
    with pytest.raises(ConfigError, match=r"input 'features' has shape \[4, 63\]"):
        optimize(source, wrong, tmp_path / "r" / "m")
    unlabelled = tmp_path / "unlabelled.npz"
    np.savez(unlabelled, features=np.zeros((4, 64), np.float32))
    with pytest.raises(ConfigError, match="needs a 'labels' array"):
        optimize(source, unlabelled, tmp_path / "r" / "m", only=["fp32"])
    with pytest.raises(ConfigError, match=r"give an \.onnx file"):
        optimize(tmp_path / "model.bin", eval_path, tmp_path / "r" / "m")
    with pytest.raises(ConfigError, match="no such TorchScript file"):
        optimize(tmp_path / "model.pt", eval_path, tmp_path / "r" / "m")
    with pytest.raises(ConfigError, match="metric 'f1'"):
        optimize(source, eval_path, tmp_path / "r" / "m", metric="f1")
    renamed = tmp_path / "renamed.npz"
    np.savez(renamed, x=np.zeros((4, 64), np.float32))
    with pytest.raises(ConfigError, match=r"has inputs \['x'\] but the model takes \['features'\]"):
        optimize(source, renamed, tmp_path / "r" / "m")


def test_openvino_variants_pin_precision_and_count_their_weights(
    example_repo: Path, data: tuple[Path, Path], tmp_path: Path
) -> None:
    import openvino as ov

    eval_path, calib = data
    out = tmp_path / "repo" / "m"
    report = optimize(
        example_repo / "fraud_mlp" / "1" / "model.onnx",
        eval_path,
        out,
        calib,
        only=["fp32", "openvino", "nncf_int8"],
        rounds=1,
        batches=(1, 8),
        final_rounds=3,
    )
    rows = {r["name"]: r for r in report.rows}
    assert "INFERENCE_PRECISION_HINT=f32 pinned" in rows["openvino_f32"]["note"]
    assert abs(rows["openvino_f32"]["delta"]) < 1e-3 and abs(rows["nncf_int8"]["delta"]) < 0.02
    xml = tmp_path / "repo" / ".m-variants" / "nncf_int8.xml"
    assert rows["nncf_int8"]["size_bytes"] > xml.stat().st_size  # the .bin weights are counted
    ops = {op.get_type_name() for op in ov.Core().read_model(str(xml)).get_ops()}
    assert "FakeQuantize" in ops
    assert all(rows[n]["servable"] for n in ("openvino_f32", "nncf_int8"))  # the openvino backend serves them
    assert report.winner is not None and report.why


def test_sensitive_nodes_of_minilm_are_its_ffn_output_matmuls(example_repo: Path) -> None:
    """The outlier ranking finds what the literature says: in BERT, the MatMuls fed by the
    GELU (FFN outputs) have the widest activations, so they stay in FP32."""
    import onnx

    from milliserve.examples.sentiment import tokenize
    from milliserve.optimize.static_int8 import sensitive_nodes

    path = example_repo / "minilm" / "1" / "model.onnx"
    texts = [
        "I can't wait to ride in a self-driving car",
        "autonomous vehicles will never be safe",
        "the weather is nice today",
        "worst traffic jam ever, robots please drive for me",
    ] * 4
    calib = [tokenize(texts[i : i + 8], 24) for i in range(0, 16, 8)]
    found = sensitive_nodes(path, calib)
    graph = onnx.load(str(path)).graph
    producer = {o: n for n in graph.node for o in n.output}
    nodes = {n.name: n for n in graph.node}

    def fed_by_gelu(name: str, depth: int = 4) -> bool:
        todo = [nodes[name].input[0]]
        for _ in range(depth):
            ops = [producer[t] for t in todo if t in producer]
            if any(n.op_type == "Erf" for n in ops):
                return True
            todo = [i for n in ops for i in n.input]
        return False

    assert len(found) >= 4
    assert all(fed_by_gelu(name) for name, _ in found[:4]), found[:4]


def balanced_accuracy(outputs: np.ndarray, labels: np.ndarray, reference: np.ndarray) -> float:
    """A user metric, given to optimize as module:function."""
    pred = outputs.argmax(-1)
    return float(np.mean([(pred[labels == c] == c).mean() for c in np.unique(labels)]))


def test_user_metric_function_scores_the_variants() -> None:
    from milliserve.optimize.measure import score

    labels = np.array([0, 0, 0, 1])
    outputs = np.array([[1.0, 0], [1, 0], [1, 0], [1, 0]])  # always class 0
    data = EvalSet({"x": np.zeros((4, 1), np.float32)}, labels)
    assert score(f"{__name__}:balanced_accuracy", outputs, data, outputs) == 0.5
    assert score("accuracy", outputs, data, outputs) == 0.75
    with pytest.raises(ConfigError, match="cannot import"):
        score("nope:missing", outputs, data, outputs)
