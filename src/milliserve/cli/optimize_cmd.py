"""``milliserve optimize``: build, measure and ship the fastest variant of a model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_optimize_parser"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive sizes like 1,8,32")
    return values


def _optimize(args: argparse.Namespace) -> int:
    from milliserve.optimize.api import optimize
    from milliserve.optimize.progress import RichProgress
    from milliserve.optimize.torch_variants import TrainConfig

    progress = RichProgress()
    console = progress.console
    report = optimize(
        args.source,
        args.eval,
        args.output,
        args.calibration,
        args.tolerance,
        args.metric,
        args.latency,
        args.threads,
        only=args.variant,
        progress=progress,
        train_path=args.train,
        prune_amount=args.prune,
        student=args.student,
        student_layers=args.student_layers,
        train_config=TrainConfig(
            epochs=args.epochs, lr=args.lr, temperature=args.temperature, alpha=args.alpha
        ),
        batches=tuple(args.batches),
        rounds=args.rounds,
        budget_s=args.budget_s,
        finalists=args.finalists,
        final_rounds=args.final_rounds,
        ship=args.ship,
    )
    print((args.output / "report.md").read_text())
    if report.winner is None:
        console.print(
            f"[red]no variant kept {args.metric} within {args.tolerance} of FP32; nothing shipped[/red]"
        )
        return 1
    console.print(f"{report.why}")
    console.print(
        f"shipped {report.winner} to {args.output}; serve it with: milliserve serve {args.output.parent}"
    )
    return 0


def add_optimize_parser(sub: Any) -> None:
    """``optimize``."""
    o = sub.add_parser("optimize", help="build, measure and ship the fastest variant of a model")
    o.add_argument(
        "source",
        help="an .onnx model, a TorchScript file, or package.module:factory returning (nn.Module, example)",
    )
    o.add_argument("--eval", type=Path, required=True, help=".npz of inputs (and 'labels' for accuracy)")
    o.add_argument("--calibration", type=Path, default=None, help=".npz of inputs for static INT8")
    o.add_argument(
        "--tolerance", type=float, default=0.01, help="allowed quality drop from FP32 (default 0.01)"
    )
    o.add_argument(
        "--metric",
        default="accuracy",
        help="accuracy (needs labels), cosine (to FP32), embedding (cosine and recall@10 "
        "to FP32's vectors), or module:function",
    )
    o.add_argument(
        "--train", type=Path, default=None, help=".npz of inputs and labels for fine-tuning and distillation"
    )
    o.add_argument("--prune", type=float, default=0.5, help="pruning amount, 0..1 (default 0.5)")
    o.add_argument("--student", default=None, help="module:factory returning the student nn.Module")
    o.add_argument(
        "--student-layers", type=int, default=None, help="keep this many teacher layers (default a third)"
    )
    o.add_argument("--epochs", type=int, default=2, help="fine-tuning and distillation epochs (default 2)")
    o.add_argument("--lr", type=float, default=1e-4, help="fine-tuning and distillation learning rate")
    o.add_argument("--temperature", type=float, default=2.0, help="distillation temperature (default 2)")
    o.add_argument(
        "--alpha", type=float, default=0.5, help="weight of the teacher's soft targets (default 0.5)"
    )
    o.add_argument("--batches", default="1,8,32", type=_ints, help="batch sizes to time (default 1,8,32)")
    o.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    o.add_argument(
        "--latency",
        default="p50_b1_us",
        help="what 'fastest' means (default p50_b1_us; a p99 needs 1000 calls per variant, see --rounds)",
    )
    o.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="time bound of each accuracy-aware INT8 search (default 300)",
    )
    o.add_argument(
        "--finalists", type=int, default=3, help="variants re-timed head to head with FP32 (default 3)"
    )
    o.add_argument(
        "--final-rounds",
        type=int,
        default=15,
        help="interleaved rounds of the head-to-head re-timing (default 15)",
    )
    o.add_argument(
        "--ship", default=None, help="ship this variant instead (built, servable, within tolerance)"
    )
    o.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads while measuring (default 1)")
    o.add_argument("--variant", action="append", help="build only these variants (repeatable)")
    o.add_argument("--output", type=Path, required=True, help="REPO/NAME to write the winner into")
    o.set_defaults(func=_optimize)
