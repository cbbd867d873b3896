"""Variants derived from a PyTorch source: pruned (magnitude, structured), a distilled
student (each exported, then quantized), and ``torch.compile`` as a reference row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milliserve.errors import ConfigError
from milliserve.optimize.cpu import CpuInfo
from milliserve.optimize.measure import EvalSet
from milliserve.optimize.progress import Progress
from milliserve.optimize.sources import ExportError, Source, TorchModel, export_onnx, load_module_factory
from milliserve.optimize.torch_variants import (
    CannotApply,
    TrainConfig,
    distill,
    finish_pruning,
    layer_stack,
    magnitude_prune,
    sparsity,
    structured_prune,
    student_from_layers,
)
from milliserve.optimize.variant import Variant
from milliserve.optimize.variants import build_variants, wanted_by

__all__ = ["Options", "torch_compile_reference", "torch_variants"]


def torch_variants(
    src: Source,
    work: Path,
    cpu: CpuInfo,
    train: EvalSet | None,
    opts: Options,
    progress: Progress,
) -> list[Variant]:
    """Pruning and distillation of a PyTorch source, each exported then quantized."""
    names = ("pruned_magnitude", "pruned_structured", "student")
    wanted = wanted_by(opts.only)
    if src.torch is None:
        return [Variant(n, None, skipped="needs a PyTorch source") for n in names if wanted(n)]
    teacher = src.torch
    out: list[Variant] = []

    def ship(name: str, module: Any, note: str, quantize: tuple[str, ...]) -> None:
        try:
            path = export_onnx(
                TorchModel(module, teacher.example, list(teacher.output_names)), work / f"{name}.onnx"
            )
        except ExportError as exc:
            out.append(Variant(name, None, skipped=str(exc)))
            return
        out.append(Variant(name, path, note))
        if quantize:
            out.extend(
                build_variants(
                    path, work, cpu, None, opts.only, progress, prefix=f"{name}_", builders=quantize
                )
            )

    tuned = (
        " and fine-tuned (distilled from the original)"
        if train is not None
        else ", not fine-tuned (no --train)"
    )
    if wanted("pruned_magnitude"):
        progress.stage("pruned_magnitude")
        pruned = magnitude_prune(teacher.module, opts.prune_amount)
        if train is not None:
            distill(pruned, teacher.module, train, opts.train, progress, "fine-tuning pruned_magnitude")
        finish_pruning(pruned)
        ship(
            "pruned_magnitude",
            pruned,
            f"{sparsity(pruned):.0%} of Linear/Conv weights zeroed (global L1){tuned}; "
            "ONNX Runtime's dense kernels still multiply the zeros",
            (),
        )
    if wanted("pruned_structured"):
        progress.stage("pruned_structured")
        try:
            pruned, what = structured_prune(teacher.module, opts.prune_amount)
        except CannotApply as exc:
            out.append(Variant("pruned_structured", None, skipped=str(exc)))
        else:
            if train is not None:
                distill(pruned, teacher.module, train, opts.train, progress, "fine-tuning pruned_structured")
            ship("pruned_structured", pruned, f"{what}{tuned}", ("int8_dynamic",))
    if wanted("student"):
        progress.stage("student")
        if train is None:
            out.append(Variant("student", None, skipped="distillation needs training data (--train)"))
            return out
        try:
            if opts.student:
                module = load_module_factory(opts.student)
                what = f"{opts.student}"
            else:
                stack = layer_stack(teacher.module)
                depth = len(getattr(stack[0], stack[1].rsplit(".", 1)[-1])) if stack else 0
                module, what = student_from_layers(teacher.module, opts.student_layers or max(1, depth // 3))
        except (CannotApply, ConfigError) as exc:
            out.append(Variant("student", None, skipped=str(exc)))
            return out
        cfg = opts.train
        distill(module, teacher.module, train, cfg, progress, "distilling the student")
        note = (
            f"student: {what}, distilled (KL at T={cfg.temperature}, alpha={cfg.alpha}, {cfg.epochs} epochs)"
        )
        ship("student", module, note, ("bert_fused", "int8_dynamic"))
    return out


@dataclass
class Options:
    only: list[str] | None
    prune_amount: float
    student: str | None
    student_layers: int | None
    train: TrainConfig


def torch_compile_reference(src: Source, only: list[str] | None) -> list[Variant]:
    """``torch.compile`` (inductor) of a PyTorch source, timed as a reference row: what
    staying in PyTorch would give, against the shipped ONNX/OpenVINO variant."""
    if not wanted_by(only)("torch_compile"):
        return []
    if src.torch is None:
        return [Variant("torch_compile", None, skipped="needs a PyTorch source")]
    if not hasattr(src.torch.module, "forward") or type(src.torch.module).__name__ == "RecursiveScriptModule":
        return [Variant("torch_compile", None, skipped="torch.compile does not take a TorchScript module")]
    return [
        Variant(
            "torch_compile",
            Path("torch.compile"),
            "torch.compile (inductor, default mode) of the PyTorch source; a reference row: "
            "milliserve has no PyTorch backend, so it is never shipped",
            runtime="torch_compile",
            module=src.torch,
        )
    ]
