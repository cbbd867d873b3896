"""``milliserve optimize`` as a library: build variants of an ONNX model, score and
time each, ship the fastest that keeps its quality into a model repository, and
write the report (report.md, report.json, pareto.png)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milliserve.errors import ConfigError
from milliserve.optimize.cpu import CpuInfo, cpu_info
from milliserve.optimize.measure import (
    BATCHES,
    EvalSet,
    ModelRef,
    check_inputs,
    load_arrays,
    measure,
    metric_function,
    predict,
    score,
)
from milliserve.optimize.progress import Progress, quiet
from milliserve.optimize.select import Candidate, pareto_front, select, suggest_batching
from milliserve.optimize.sources import (
    ExportError,
    Source,
    TorchModel,
    export_onnx,
    load_module_factory,
    load_source,
    with_example,
)
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
from milliserve.optimize.variants import Variant, build_variants, wanted_by
from milliserve.plotting import pyplot

__all__ = ["OptimizeReport", "optimize"]


@dataclass
class OptimizeReport:
    source: str
    metric: str
    tolerance: float
    latency_key: str
    cpu: dict[str, Any]
    threads: int
    reference: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    winner: str | None = None
    pareto: list[str] = field(default_factory=list)
    output: str | None = None
    batches: list[int] = field(default_factory=lambda: list(BATCHES))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _calibration(data: EvalSet, batch: int = 16, batches: int = 8) -> list[dict[str, Any]]:
    return [
        {k: v[i * batch : (i + 1) * batch] for k, v in data.inputs.items()}
        for i in range(min(batches, max(1, data.rows // batch)))
    ]


def _config_pbtxt(name: str, model: Path, batching: dict[str, Any]) -> str:
    import onnxruntime as ort

    from milliserve.backends.onnxruntime import tensor_spec
    from milliserve.protocol.datatypes import oip_to_config_type

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    specs_in = [tensor_spec(i) for i in sess.get_inputs()]
    specs_out = [tensor_spec(o) for o in sess.get_outputs()]
    batched = all(s.dims and s.dims[0] == -1 for s in specs_in + specs_out)

    def tensors(specs: list[Any]) -> str:
        return ", ".join(
            f'{{ name: "{s.name}" data_type: {oip_to_config_type(s.datatype)} '
            f"dims: [ {', '.join(str(d) for d in (s.dims[1:] if batched else s.dims))} ] }}"
            for s in specs
        )

    lines = [
        f'name: "{name}"',
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {32 if batched else 0}",
        f"input [ {tensors(specs_in)} ]",
        f"output [ {tensors(specs_out)} ]",
    ]
    if batched and batching:
        lines.append(
            f"dynamic_batching {{ preferred_batch_size: {batching['preferred_batch_size']} "
            f"max_queue_delay_microseconds: {batching['max_queue_delay_microseconds']} }}"
        )
    lines.append('parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')
    return "\n".join(lines) + "\n"


def _torch_variants(
    src: Source,
    work: Path,
    cpu: CpuInfo,
    train: EvalSet | None,
    opts: _Options,
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
class _Options:
    only: list[str] | None
    prune_amount: float
    student: str | None
    student_layers: int | None
    train: TrainConfig


def optimize(
    source: str | Path,
    eval_path: Path,
    output: Path,
    calibration_path: Path | None = None,
    tolerance: float = 0.01,
    metric: str = "accuracy",
    latency_key: str = "p99_b1_us",
    threads: int = 1,
    work_dir: Path | None = None,
    only: list[str] | None = None,
    progress: Progress = quiet,
    train_path: Path | None = None,
    prune_amount: float = 0.5,
    student: str | None = None,
    student_layers: int | None = None,
    train_config: TrainConfig | None = None,
    batches: tuple[int, ...] = BATCHES,
    rounds: int = 5,
) -> OptimizeReport:
    """Run the search and write ``output`` (``REPO/NAME``) with the winner, plus the report files.

    ``source`` is an .onnx file, a TorchScript file or ``package.module:factory``; ``metric``
    is ``accuracy``, ``cosine`` or ``module:function``. Raises ConfigError for a missing
    source, EVAL data that does not fit the model, or a metric the data cannot support;
    ExportError when a PyTorch source cannot be exported. Variants that fail are reported
    as skipped.
    """
    if metric not in ("accuracy", "cosine") and ":" not in metric:
        raise ConfigError(f"metric {metric!r}: choose accuracy, cosine or module:function")
    if ":" in metric:
        metric_function(metric)
    src = load_source(source)
    data = load_arrays(eval_path)
    if src.torch is not None:
        with_example(src.torch, data.inputs)
    calib_data = load_arrays(calibration_path) if calibration_path else None
    train = load_arrays(train_path) if train_path else None
    work = work_dir or output.parent / f".{output.name}-variants"
    work.mkdir(parents=True, exist_ok=True)
    if src.torch is not None:
        progress.stage("exporting to ONNX (opset 17) and checking against PyTorch")
        fp32 = export_onnx(src.torch, work / "export.onnx")
    else:
        assert src.onnx is not None
        fp32 = src.onnx
    check_inputs(fp32, data, f"EVAL {eval_path}")
    if calib_data is not None:
        check_inputs(fp32, calib_data, f"calibration {calibration_path}")
    if train is not None:
        check_inputs(fp32, train, f"training data {train_path}")
    cpu = cpu_info()
    progress.stage("FP32 reference")
    reference_out = predict(fp32, data, threads)
    reference = score(metric, reference_out, data, reference_out)
    scores: dict[Path | ModelRef, float] = {}

    def scorer(path: Path | ModelRef) -> float:
        if path not in scores:
            scores[path] = score(metric, predict(path, data, threads), data, reference_out)
        return scores[path]

    opts = _Options(only, prune_amount, student, student_layers, train_config or TrainConfig())
    variants = build_variants(
        fp32, work, cpu, _calibration(calib_data) if calib_data else None, only, progress, scorer
    )
    variants += _torch_variants(src, work, cpu, train, opts, progress)
    built: list[Variant] = [v for v in variants if v.path is not None]
    progress.stage("scoring every variant on EVAL")
    quality = {v.name: scorer(v.ref) for v in built}
    progress.stage("timing every variant (interleaved)")
    timings = measure({v.name: v.ref for v in built}, data, threads, rounds=rounds, batches=batches)
    # milliserve serves ONNX through ONNX Runtime: OpenVINO variants are measured, not shipped
    candidates = [
        Candidate(v.name, quality[v.name], timings[v.name], servable=v.runtime == "onnxruntime")
        for v in built
    ]
    winner = select(candidates, reference, tolerance, latency_key)
    report = OptimizeReport(
        str(source),
        metric,
        tolerance,
        latency_key,
        cpu.as_dict(),
        threads,
        reference,
        pareto=pareto_front(candidates, latency_key),
        batches=list(batches),
    )
    base_b1 = timings.get("fp32", {}).get("p50_b1_us")
    for v in variants:
        row: dict[str, Any] = {"name": v.name, "note": v.note, "skipped": v.skipped}
        if v.name.startswith("pruned_") and v.name in timings and base_b1:
            # does the sparsity buy anything on this runtime? say it next to the numbers
            row["note"] += f"; runs in {timings[v.name]['p50_b1_us'] / base_b1:.2f}× FP32's batch-1 p50"
        if v.path is not None:
            row |= {
                "quality": quality[v.name],
                "delta": quality[v.name] - reference,
                "size_bytes": _size(v.path),
                **timings[v.name],
            }
        report.rows.append(row)
    if winner is not None:
        report.winner = winner.name
        vdir = output / "1"
        vdir.mkdir(parents=True, exist_ok=True)
        model_path = vdir / "model.onnx"
        shutil.copy(next(v.path for v in built if v.name == winner.name), model_path)  # type: ignore[arg-type]
        (output / "config.pbtxt").write_text(
            _config_pbtxt(output.name, model_path, suggest_batching(winner.timing))
        )
        report.output = str(output)
    _write_reports(report, output)
    return report


def _size(path: Path) -> int:
    """Bytes on disk; an OpenVINO IR keeps its weights in the .bin beside the .xml."""
    weights = path.with_suffix(".bin")
    return path.stat().st_size + (
        weights.stat().st_size if path.suffix == ".xml" and weights.is_file() else 0
    )


def _write_reports(report: OptimizeReport, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.json").write_text(json.dumps(report.as_dict(), indent=2))
    key = report.latency_key
    big = max(report.batches)
    lines = [
        f"# Optimisation report: {report.source}",
        "",
        f"CPU: {report.cpu['model']} ({report.cpu['cores']} cores, flags {' '.join(report.cpu['flags'])}); "
        f"{report.threads} ONNX Runtime thread(s); variants timed round-robin in one process.",
        f"Metric: {report.metric} (FP32 {report.reference:.4f}), tolerance {report.tolerance}; "
        f"chosen on {key}: **{report.winner or 'none within tolerance'}**.",
        "",
        "| variant | quality | Δ vs FP32 | p50 b1 µs | p99 b1 µs "
        f"| p50 b{big} µs | b{big} items/s | size KiB | memory MiB | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        if r["skipped"]:
            lines.append(f"| {r['name']} | - | - | - | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        mark = " (Pareto)" if r["name"] in report.pareto else ""
        lines.append(
            f"| {r['name']}{mark} | {r['quality']:.4f} | {r['delta']:+.4f} | {r.get('p50_b1_us', 0):.1f} | "
            f"{r.get('p99_b1_us', 0):.1f} | {r.get(f'p50_b{big}_us', 0):.1f} | "
            f"{r.get(f'throughput_b{big}', 0):,.0f} | {r['size_bytes'] / 1024:,.0f} | {r['rss_mb']:.1f} | "
            f"{r['note']} |"
        )
    (output / "report.md").write_text("\n".join(lines) + "\n")
    _plot(report, output / "pareto.png")


def _plot(report: OptimizeReport, path: Path) -> None:
    plt = pyplot("milliserve optimize's Pareto plot")

    rows = [r for r in report.rows if not r["skipped"]]
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        on_front = r["name"] in report.pareto
        ax.scatter(
            r[report.latency_key], r["quality"], s=60 if on_front else 30, c="C3" if on_front else "C0"
        )
        ax.annotate(
            r["name"],
            (r[report.latency_key], r["quality"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    front = sorted((r for r in rows if r["name"] in report.pareto), key=lambda r: r[report.latency_key])
    ax.plot(
        [r[report.latency_key] for r in front], [r["quality"] for r in front], "C3--", label="Pareto front"
    )
    ax.axhline(report.reference - report.tolerance, color="grey", lw=0.8, ls=":", label="FP32 - tolerance")
    ax.set_xlabel(f"{report.latency_key} (µs)")
    ax.set_ylabel(report.metric)
    ax.set_title("Quality against latency")
    ax.legend()
    fig.savefig(path, dpi=100)
    plt.close(fig)
