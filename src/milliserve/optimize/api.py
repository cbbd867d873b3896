"""``milliserve optimize`` as a library: build variants of an ONNX model, score and
time each, ship the fastest that keeps its quality into a model repository, and
write the report (report.md, report.json, pareto.png).

Choosing is done in two passes. Every variant is timed round-robin; the fastest few
within tolerance are then re-timed head to head with FP32 in more interleaved rounds,
and a winner must beat FP32 by more than the spread of those rounds (``select``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from milliserve.errors import ConfigError
from milliserve.optimize.accuracy_search import damage_on
from milliserve.optimize.cpu import cpu_info
from milliserve.optimize.derived import Options, torch_compile_reference, torch_variants
from milliserve.optimize.measure import (
    BATCHES,
    METRICS,
    EvalSet,
    ModelRef,
    check_inputs,
    embedding_measures,
    load_arrays,
    measure_rounds,
    metric_function,
    predict,
    score,
    static_batch,
)
from milliserve.optimize.openvino_variants import AccuracyControl
from milliserve.optimize.progress import Progress, quiet
from milliserve.optimize.report import OptimizeReport, write_reports
from milliserve.optimize.select import (
    Candidate,
    latency_parts,
    pareto_front,
    select,
    speedup_interval,
    suggest_batching,
)
from milliserve.optimize.ship import ship as ship_variant
from milliserve.optimize.sources import export_onnx, load_source, with_example
from milliserve.optimize.static_int8 import SearchContext
from milliserve.optimize.torch_variants import TrainConfig
from milliserve.optimize.variant import Variant
from milliserve.optimize.variants import build_variants

__all__ = ["OptimizeReport", "optimize"]


def _calibration(data: EvalSet, batch: int = 16, batches: int = 8) -> list[dict[str, Any]]:
    return [
        {k: v[i * batch : (i + 1) * batch] for k, v in data.inputs.items()}
        for i in range(min(batches, max(1, data.rows // batch)))
    ]


def _subset(data: EvalSet, rows: int) -> EvalSet:
    return EvalSet(
        {k: v[:rows] for k, v in data.inputs.items()},
        None if data.labels is None else data.labels[:rows],
        data.fixed_batch,
    )


def optimize(
    source: str | Path,
    eval_path: Path,
    output: Path,
    calibration_path: Path | None = None,
    tolerance: float = 0.01,
    metric: str = "accuracy",
    latency_key: str = "p50_b1_us",
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
    budget_s: float = 300.0,
    finalists: int = 3,
    final_rounds: int = 15,
    min_gain: float = 0.02,
    ship: str | None = None,
) -> OptimizeReport:
    """Run the search and write ``output`` (``REPO/NAME``) with the winner, plus the report files.

    ``source`` is an .onnx file, a TorchScript file or ``package.module:factory``; ``metric``
    is ``accuracy``, ``cosine``, ``embedding`` (mean cosine and recall@10 to FP32's vectors:
    ``measure.embedding_measures``; each row of the report carries both) or
    ``module:function``. ``budget_s`` bounds each
    accuracy-aware INT8 search; ``ship`` names a variant to ship instead of the chosen one
    (it must be built, servable and within tolerance). Raises ConfigError for a missing
    source, EVAL data that does not fit the model, a metric the data cannot support or a
    ``ship`` that cannot be honoured; ExportError when a PyTorch source cannot be
    exported. Variants that fail are reported as skipped.
    """
    if metric not in METRICS and ":" not in metric:
        raise ConfigError(f"metric {metric!r}: choose accuracy, cosine, embedding or module:function")
    if ":" in metric:
        metric_function(metric)
    try:
        _, key_batch = latency_parts(latency_key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if rounds < 1 or final_rounds < 1 or finalists < 0:
        raise ConfigError(f"rounds ({rounds}) and final rounds ({final_rounds}) must be at least 1")
    if tolerance < 0 or threads < 1:
        raise ConfigError(f"tolerance ({tolerance}) must be >= 0 and threads ({threads}) >= 1")
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
    fixed = static_batch(fp32)
    if fixed is not None:  # a model exported with a fixed batch runs only at that batch size
        batches = (fixed,)
        if key_batch != fixed:
            if latency_key != "p50_b1_us":
                raise ConfigError(
                    f"the model's batch size is fixed at {fixed}: use --latency p50_b{fixed}_us"
                )
            latency_key, key_batch = f"p50_b{fixed}_us", fixed
        for d in (data, calib_data, train):
            if d is not None:
                d.fixed_batch = fixed
    if key_batch not in batches:
        raise ConfigError(
            f"latency key {latency_key!r} needs batch {key_batch} among the timed batches {list(batches)}"
        )
    if calib_data is not None:
        check_inputs(fp32, calib_data, f"calibration {calibration_path}")
    if train is not None:
        check_inputs(fp32, train, f"training data {train_path}")
    cpu = cpu_info()
    progress.stage("FP32 reference")
    reference_out = predict(fp32, data, threads)
    reference = score(metric, reference_out, data, reference_out)
    scores: dict[Path | ModelRef, float] = {}
    measures: dict[Path | ModelRef, dict[str, float]] = {}  # the embedding metric's parts

    def scorer(path: Path | ModelRef) -> float:
        if path not in scores:
            out = predict(path, data, threads)
            scores[path] = score(metric, out, data, reference_out)
            if metric == "embedding":
                measures[path] = embedding_measures(out, data, reference_out)
        return scores[path]

    quick = _subset(data, min(128, data.rows))  # ranking damage: smooth, so 128 rows separate nodes
    search = SearchContext(
        scorer, damage_on(quick, reference_out[: quick.rows], threads), reference - tolerance, budget_s
    )
    control = AccuracyControl(data, metric, reference_out, reference, tolerance)
    opts = Options(only, prune_amount, student, student_layers, train_config or TrainConfig())
    calib = _calibration(calib_data, batch=fixed or 16) if calib_data else None
    variants = build_variants(fp32, work, cpu, calib, only, progress, scorer, search=search, control=control)
    variants += torch_variants(src, work, cpu, train, opts, progress)
    variants += torch_compile_reference(src, only)
    for v in [v for v in variants if v.runtime == "torch_compile" and v.path is not None]:
        try:  # compile errors surface on the first call
            progress.stage("torch_compile: compiling and scoring")
            scorer(v.ref)
        except Exception as exc:
            v.path, v.skipped = (
                None,
                f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
    built: list[Variant] = [v for v in variants if v.path is not None]
    progress.stage("scoring every variant on EVAL")
    quality = {v.name: scorer(v.ref) for v in built}
    with progress.steps("timing every variant (interleaved rounds)", rounds) as advance:
        timed = measure_rounds(
            {v.name: v.ref for v in built}, data, threads, rounds=rounds, batches=batches, advance=advance
        )
    timings = {n: t.summary() for n, t in timed.items()}
    candidates = {
        v.name: Candidate(v.name, quality[v.name], timings[v.name], v.servable, dict(timed[v.name].rounds))
        for v in built
    }
    first = (
        {n: speedup_interval(timed["fp32"].rounds[key_batch], t.rounds[key_batch]) for n, t in timed.items()}
        if "fp32" in timed
        else {}
    )
    # finalists are re-timed against FP32, so only when FP32 was timed (not with --variant minus fp32)
    final = (
        _finalists(candidates, reference, tolerance, latency_key, finalists) if "fp32" in candidates else []
    )
    if final:
        progress.stage(f"re-timing the finalists head to head: {', '.join(final)}")
        with progress.steps("re-timing finalists", final_rounds) as advance:
            again = measure_rounds(
                {n: next(v.ref for v in built if v.name == n) for n in ["fp32", *final]},
                data,
                threads,
                rounds=final_rounds,
                seconds_per_round=0.2,
                batches=(key_batch,),
                advance=advance,
            )
        for n, t in again.items():
            candidates[n].rounds = {key_batch: t.rounds[key_batch]}
            candidates[n].timing = {**candidates[n].timing, **t.summary()}
    pool = [candidates[n] for n in ["fp32", *final]] if final else list(candidates.values())
    selection = select(pool, reference, tolerance, latency_key, min_gain)
    chosen = selection.winner
    why = selection.reason
    refused = ""
    if ship is not None:
        refused = _cannot_ship(ship, variants, candidates, reference - tolerance)
        if refused:
            chosen, why = None, f"nothing shipped: {refused}"
        else:
            measured = chosen.name if chosen else "none"
            chosen, why = (
                candidates[ship],
                f"{ship}: shipped as asked (--ship); the measured choice was {measured}",
            )
    report = OptimizeReport(
        str(source),
        metric,
        tolerance,
        selection.key,
        cpu.as_dict(),
        threads,
        reference,
        pareto=pareto_front(list(candidates.values()), selection.key),
        batches=list(batches),
        finalists=final,
        final_rounds=final_rounds,
        why=why,
        item_shapes={name: [int(d) for d in arr.shape[1:]] for name, arr in data.inputs.items()},
    )
    base_b1 = timings.get("fp32", {}).get("p50_b1_us")
    for v in variants:
        row: dict[str, Any] = {
            "name": v.name,
            "note": v.note,
            "skipped": v.skipped,
            "runtime": v.runtime,
            "servable": v.servable,
            "search": [s.__dict__ for s in v.search],
        }
        if v.name.startswith("pruned_") and v.name in timings and base_b1:
            # does the sparsity buy anything on this runtime? say it next to the numbers
            row["note"] += f"; runs in {timings[v.name]['p50_b1_us'] / base_b1:.2f}× FP32's batch-1 p50"
        if v.path is not None:
            c = candidates[v.name]
            p, lo, hi = selection.intervals.get(v.name) or first.get(v.name) or (np.nan, np.nan, np.nan)
            row |= {
                "quality": quality[v.name],
                "delta": quality[v.name] - reference,
                **({"measures": measures[v.ref]} if v.ref in measures else {}),
                "size_bytes": _size(v.path) if v.runtime != "torch_compile" else 0,
                **c.timing,
                "speedup": p,
                "speedup_low": lo,
                "speedup_high": hi,
            }
        report.rows.append(row)
    if chosen is not None:
        report.winner = chosen.name
        winner = next(v for v in built if v.name == chosen.name)
        ship_variant(winner, fp32, output, suggest_batching(chosen.timing))
        report.output = str(output)
    write_reports(report, output)
    if refused:  # the measurements are in the report; the request could not be honoured
        raise ConfigError(refused)
    return report


def _cannot_ship(ship: str, variants: list[Variant], candidates: dict[str, Candidate], floor: float) -> str:
    """Why ``--ship NAME`` cannot be honoured, or "" when it can."""
    variant = next((v for v in variants if v.name == ship), None)
    if variant is None:
        return f"--ship {ship!r}: no such variant; this run had {sorted(v.name for v in variants)}"
    if variant.skipped:
        return f"--ship {ship!r}: it was not built ({variant.skipped})"
    c = candidates[ship]
    if not c.servable:
        return f"--ship {ship!r}: a reference row milliserve cannot serve"
    if c.quality < floor:
        return f"--ship {ship!r}: its quality {c.quality:.4f} is below FP32 minus the tolerance ({floor:.4f})"
    return ""


def _finalists(
    candidates: dict[str, Candidate], reference: float, tolerance: float, key: str, n: int
) -> list[str]:
    """The ``n`` fastest servable variants within tolerance on the first pass (not FP32),
    plus the ORT-optimised FP32 graph, which ships when nothing beats FP32."""
    ok = sorted(
        (
            c
            for c in candidates.values()
            if c.servable and c.name != "fp32" and c.quality >= reference - tolerance and key in c.timing
        ),
        key=lambda c: c.latency(key),
    )
    names = [c.name for c in ok[:n]]
    if (
        "ort_optimized" in candidates
        and "ort_optimized" not in names
        and candidates["ort_optimized"].quality >= reference - tolerance
    ):
        names.append("ort_optimized")
    return names


def _size(path: Path) -> int:
    """Bytes on disk; an OpenVINO IR keeps its weights in the .bin beside the .xml."""
    weights = path.with_suffix(".bin")
    return path.stat().st_size + (
        weights.stat().st_size if path.suffix == ".xml" and weights.is_file() else 0
    )
