"""Check what `milliserve optimize` shipped, knowing nothing of how it chose: load the
model from the repository folder as the server would (its config.pbtxt's platform and
parameters), and the FP32 source beside it, then on held-out rows compare accuracy and
batch-1 latency, the two timed interleaved (A B A B ...) on one thread.

    python benchmarks/check_shipped.py REPO/NAME FP32.onnx HELDOUT.npz [--rounds 30]

The speed-up is FP32's p50 over the shipped model's, with a 95% bootstrap interval over
rounds (rounds resampled with replacement, ratio of the medians). Verdicts: ``no_slower``
when the interval reaches 1.0 or above (not significantly slower), ``within_tolerance``
when the held-out accuracy loses at most ``tolerance``.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.percentiles import percentile, percentiles

Arrays = dict[str, np.ndarray[Any, Any]]

__all__ = ["check", "config_of", "markdown_header", "markdown_row"]


def config_of(model_dir: Path) -> tuple[str, dict[str, str]]:
    """The platform and the string ``parameters`` of ``model_dir/config.pbtxt``."""
    text = (model_dir / "config.pbtxt").read_text()
    found = re.search(r'^\s*platform:\s*"([^"]+)"', text, re.M)
    if found is None:
        raise ValueError(f"{model_dir / 'config.pbtxt'} names no platform")
    params = dict(re.findall(r'key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}', text))
    return found.group(1), params


class _Ort:
    """An ONNX Runtime session set up as milliserve's backend sets one up."""

    def __init__(self, path: Path, threads: int, params: dict[str, str] | None = None) -> None:
        import onnxruntime as ort

        params = params or {}
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[params.get("graph_optimization_level", "all").lower()]
        spin = "1" if params.get("allow_spinning", "0").lower() in ("1", "true") else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", spin)
        so.add_session_config_entry("session.inter_op.allow_spinning", spin)
        so.log_severity_level = 4
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.first = self.session.get_outputs()[0].name

    def __call__(self, feeds: Arrays) -> np.ndarray[Any, Any]:
        out: np.ndarray[Any, Any] = self.session.run([self.first], feeds)[0]
        return out


class _OpenVino:
    def __init__(self, xml: Path, threads: int, params: dict[str, str]) -> None:
        import openvino as ov

        lowered = {k.lower(): v for k, v in params.items()}
        precision = lowered.get("inference_precision_hint", "f32")
        # upper-case parameters read as OpenVINO properties (PERFORMANCE_HINT, ...); the thread
        # count is this check's, so that both models run on the same number of threads
        config = {k: v for k, v in params.items() if k.isupper()}
        config |= {"INFERENCE_NUM_THREADS": str(threads), "INFERENCE_PRECISION_HINT": precision}
        self.compiled = ov.Core().compile_model(str(xml), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.first = self.compiled.outputs[0]
        self.precision = precision

    def __call__(self, feeds: Arrays) -> np.ndarray[Any, Any]:
        return np.asarray(self.request.infer(feeds)[self.first])


def load_shipped(model_dir: Path, threads: int = 1) -> tuple[Any, str]:
    """The shipped model as a callable, and a word for its runtime."""
    platform, params = config_of(model_dir)
    version = model_dir / "1"
    if platform == "onnxruntime_onnx":
        return _Ort(version / "model.onnx", threads, params), "onnxruntime"
    if platform == "openvino":
        runner = _OpenVino(version / "model.xml", threads, params)
        return runner, f"openvino ({runner.precision})"
    raise ValueError(f"{model_dir}: platform {platform!r} is neither onnxruntime_onnx nor openvino")


def _accuracy(run: Any, inputs: Arrays, labels: np.ndarray[Any, Any], chunk: int = 64) -> float:
    outs = [run({k: v[i : i + chunk] for k, v in inputs.items()}) for i in range(0, len(labels), chunk)]
    return float((np.concatenate(outs).argmax(-1) == labels).mean())


def _time_interleaved(
    runs: dict[str, Any], rows: list[Arrays], rounds: int, calls: int
) -> dict[str, list[list[float]]]:
    """Seconds per call, per round: each round runs every model for ``calls`` batch-1 calls on
    the same cycle of rows, swapping which goes first every round (A B, B A, ...)."""
    samples: dict[str, list[list[float]]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            run, got = runs[name], []
            run(rows[(r * calls) % len(rows)])  # the first call after switching models is not timed
            for j in range(calls):
                feeds = rows[(r * calls + j) % len(rows)]
                t0 = time.perf_counter()
                run(feeds)
                got.append(time.perf_counter() - t0)
            samples[name].append(got)
    return samples


def _bootstrap_ratio(
    num: list[list[float]], den: list[list[float]], resamples: int, seed: int
) -> tuple[float, float]:
    """95% interval of p50(num) / p50(den), rounds resampled in pairs."""
    a, b = np.array(num), np.array(den)
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    for i in range(resamples):
        idx = rng.integers(0, len(a), len(a))
        ratios[i] = percentile(a[idx], 50) / percentile(b[idx], 50)
    lo, hi = percentiles(ratios, [2.5, 97.5])
    return lo, hi


def check(
    repo_model_dir: Path,
    fp32_onnx: Path,
    heldout_npz: Path,
    threads: int = 1,
    rounds: int = 30,
    calls: int = 100,
    tolerance: float = 0.01,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Held-out accuracy of both models, their batch-1 latency (p50, p99, µs) and the verdicts."""
    shipped, runtime = load_shipped(repo_model_dir, threads)
    fp32 = _Ort(fp32_onnx, threads)
    with np.load(heldout_npz, allow_pickle=False) as f:
        labels = f["labels"]
        inputs = {k: f[k] for k in f.files if k != "labels"}
    acc_fp32, acc_shipped = _accuracy(fp32, inputs, labels), _accuracy(shipped, inputs, labels)
    rows = [{k: np.ascontiguousarray(v[i : i + 1]) for k, v in inputs.items()} for i in range(len(labels))]
    samples = _time_interleaved({"fp32": fp32, "shipped": shipped}, rows, rounds, calls)
    flat = {name: np.concatenate(s) * 1e6 for name, s in samples.items()}
    p50 = {name: percentile(v, 50) for name, v in flat.items()}
    lo, hi = _bootstrap_ratio(samples["fp32"], samples["shipped"], resamples, seed)
    delta = acc_shipped - acc_fp32
    return {
        "runtime": runtime,
        "threads": threads,
        "rows": len(labels),
        "rounds": rounds,
        "calls_per_round": calls,
        "accuracy_fp32": acc_fp32,
        "accuracy_shipped": acc_shipped,
        "delta_points": 100 * delta,
        "p50_fp32_us": p50["fp32"],
        "p50_shipped_us": p50["shipped"],
        "p99_fp32_us": percentile(flat["fp32"], 99),
        "p99_shipped_us": percentile(flat["shipped"], 99),
        "speedup": p50["fp32"] / p50["shipped"],
        "speedup_ci95": [lo, hi],
        "tolerance": tolerance,
        "no_slower": hi >= 1.0,
        "within_tolerance": delta >= -tolerance,
    }


def markdown_header() -> str:
    return (
        "| model | shipped | runtime | held-out acc. FP32 | shipped | Δ points | p50 b1 µs FP32 | shipped "
        "| speed-up [95% CI] | not slower | within tolerance |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )


def markdown_row(model: str, variant: str, r: dict[str, Any]) -> str:
    lo, hi = r["speedup_ci95"]
    return (
        f"| {model} | {variant} | {r['runtime']} | {r['accuracy_fp32']:.4f} | {r['accuracy_shipped']:.4f} "
        f"| {r['delta_points']:+.1f} | {r['p50_fp32_us']:.1f} | {r['p50_shipped_us']:.1f} "
        f"| {r['speedup']:.2f}× [{lo:.2f}, {hi:.2f}] | {'yes' if r['no_slower'] else '**no**'} "
        f"| {'yes' if r['within_tolerance'] else '**no**'} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("model_dir", type=Path, help="REPO/NAME holding config.pbtxt and 1/")
    ap.add_argument("fp32_onnx", type=Path)
    ap.add_argument("heldout", type=Path, help=".npz of inputs plus labels, rows optimize never saw")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--tolerance", type=float, default=0.01)
    args = ap.parse_args()
    result = check(
        args.model_dir, args.fp32_onnx, args.heldout, args.threads, args.rounds, args.calls, args.tolerance
    )
    print(json.dumps(result, indent=2))
    print(markdown_header())
    report = args.model_dir / "report.json"  # optimize writes it beside the model; only its name is read
    winner = json.loads(report.read_text()).get("winner") if report.is_file() else None
    print(markdown_row(args.model_dir.name, winner or "?", result))


if __name__ == "__main__":
    main()
