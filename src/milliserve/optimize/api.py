"""``milliserve optimize`` as a library: build variants of an ONNX model, score and
time each, ship the fastest that keeps its quality into a model repository, and
write the report (report.md, report.json, pareto.png)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milliserve.errors import ConfigError
from milliserve.optimize.cpu import cpu_info
from milliserve.optimize.measure import EvalSet, check_inputs, load_arrays, measure, predict, score
from milliserve.optimize.select import Candidate, pareto_front, select, suggest_batching
from milliserve.optimize.variants import Variant, build_variants

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


def optimize(
    source: Path,
    eval_path: Path,
    output: Path,
    calibration_path: Path | None = None,
    tolerance: float = 0.01,
    metric: str = "accuracy",
    latency_key: str = "p99_b1_us",
    threads: int = 1,
    work_dir: Path | None = None,
    only: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> OptimizeReport:
    """Run the search and write ``output`` (``REPO/NAME``) with the winner, plus the report files.

    Raises ConfigError for a missing source, EVAL data that does not fit the model,
    or a metric the data cannot support. Variants that fail are reported as skipped.
    """
    if not source.is_file() or source.suffix != ".onnx":
        raise ConfigError(f"{source}: give an .onnx file (PyTorch sources are not supported yet)")
    if metric not in ("accuracy", "cosine"):
        raise ConfigError(f"metric {metric!r}: choose accuracy or cosine")
    data = load_arrays(eval_path)
    check_inputs(source, data, f"EVAL {eval_path}")
    calib_data = load_arrays(calibration_path) if calibration_path else None
    if calib_data is not None:
        check_inputs(source, calib_data, f"calibration {calibration_path}")
    cpu = cpu_info()
    work = work_dir or output.parent / f".{output.name}-variants"
    variants = build_variants(
        source, work, cpu, _calibration(calib_data) if calib_data else None, only, progress
    )
    built: list[Variant] = [v for v in variants if v.path is not None]
    if progress:
        progress("scoring")
    reference_out = predict(source, data, threads)
    quality = {
        v.name: score(metric, predict(v.path, data, threads), data, reference_out)  # type: ignore[arg-type]
        for v in built
    }
    reference = score(metric, reference_out, data, reference_out)
    if progress:
        progress("timing (interleaved)")
    timings = measure({v.name: v.path for v in built if v.path}, data, threads)
    candidates = [Candidate(v.name, quality[v.name], timings[v.name]) for v in built]
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
    )
    for v in variants:
        row: dict[str, Any] = {"name": v.name, "note": v.note, "skipped": v.skipped}
        if v.path is not None:
            row |= {
                "quality": quality[v.name],
                "delta": quality[v.name] - reference,
                "size_bytes": v.path.stat().st_size,
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


def _write_reports(report: OptimizeReport, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.json").write_text(json.dumps(report.as_dict(), indent=2))
    key = report.latency_key
    lines = [
        f"# Optimisation report: {report.source}",
        "",
        f"CPU: {report.cpu['model']} ({report.cpu['cores']} cores, flags {' '.join(report.cpu['flags'])}); "
        f"{report.threads} ONNX Runtime thread(s); variants timed round-robin in one process.",
        f"Metric: {report.metric} (FP32 {report.reference:.4f}), tolerance {report.tolerance}; "
        f"chosen on {key}: **{report.winner or 'none within tolerance'}**.",
        "",
        "| variant | quality | Δ vs FP32 | p50 b1 µs | p99 b1 µs | p50 b32 µs | b32 items/s | size KiB "
        "| memory MiB | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        if r["skipped"]:
            lines.append(f"| {r['name']} | - | - | - | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        mark = " (Pareto)" if r["name"] in report.pareto else ""
        lines.append(
            f"| {r['name']}{mark} | {r['quality']:.4f} | {r['delta']:+.4f} | {r.get('p50_b1_us', 0):.1f} | "
            f"{r.get('p99_b1_us', 0):.1f} | {r.get('p50_b32_us', 0):.1f} | "
            f"{r.get('throughput_b32', 0):,.0f} | {r['size_bytes'] / 1024:,.0f} | {r['rss_mb']:.1f} | "
            f"{r['note']} |"
        )
    (output / "report.md").write_text("\n".join(lines) + "\n")
    _plot(report, output / "pareto.png")


def _plot(report: OptimizeReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
