"""Static INT8 (QDQ) as a search: each calibration method over all operators; then, for
the best method, each operator subset; then, when the best is still out of tolerance,
the measured search for the nodes to keep in FP32 (``accuracy_search``). Calibration
runs on a copy of the graph whose infinite constants are clamped (``graph_prep``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.optimize.accuracy_search import restore_search
from milliserve.optimize.graph_prep import clamp_nonfinite, preprocessed
from milliserve.optimize.progress import Progress, hushed, quiet
from milliserve.optimize.variant import Feeds, Scorer, Variant

__all__ = [
    "STATIC_METHODS",
    "SearchContext",
    "quantizable_nodes",
    "searched_variant",
    "sensitive_nodes",
    "static_search",
]

log = logging.getLogger(__name__)
STATIC_METHODS = ("MinMax", "Entropy", "Percentile")
WEIGHT_OPS = ("MatMul", "Gemm", "Conv", "Attention")


class _Reader:
    """Calibration batches for onnxruntime.quantization, advancing a progress bar."""

    def __init__(self, batches: list[Feeds], advance: Callable[[int], None] | None = None) -> None:
        self._it: Iterator[Feeds] = iter(batches)
        self._advance = advance

    def get_next(self) -> Feeds | None:
        item = next(self._it, None)
        if item is not None and self._advance:
            self._advance(1)
        return item


def _quantize_static(
    pre: Path,
    out: Path,
    calib: list[Feeds],
    method: str,
    progress: Progress,
    op_types: list[str] | None = None,
    exclude: list[str] | None = None,
    only: list[str] | None = None,
) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with progress.steps(f"calibrating {out.stem}", len(calib)) as advance, hushed():
        quantize_static(
            str(pre),
            str(out),
            _Reader(calib, advance),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, method),
            op_types_to_quantize=op_types,
            nodes_to_exclude=exclude or [],
            nodes_to_quantize=only,
        )


def sensitive_nodes(model: Path, calib: list[Feeds], max_fraction: float = 0.25) -> list[tuple[str, float]]:
    """MatMul/Gemm nodes whose activation input has outliers far beyond its spread
    (max |x| / std over the calibration data), worst first. These lose the most to an
    8-bit grid: in BERT-like models they are the FFN output MatMuls, fed by the GELU."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(model))
    consts = {i.name for i in m.graph.initializer} | {
        o for n in m.graph.node if n.op_type == "Constant" for o in n.output
    }
    nodes = [n for n in m.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[0] not in consts]
    if not nodes:
        return []
    known = {o.name for o in m.graph.output}
    for name in {n.input[0] for n in nodes} - known:
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    peak: dict[str, float] = {}
    sq: dict[str, float] = {}
    count: dict[str, int] = {}
    for feeds in calib:
        for name, arr in zip(names, sess.run(None, feeds), strict=True):
            a = np.asarray(arr, dtype=np.float64)
            peak[name] = max(peak.get(name, 0.0), float(np.abs(a).max(initial=0.0)))
            sq[name] = sq.get(name, 0.0) + float((a * a).sum())
            count[name] = count.get(name, 0) + a.size
    ratio = {
        n.name: peak[n.input[0]] / max(np.sqrt(sq[n.input[0]] / max(count[n.input[0]], 1)), 1e-12)
        for n in nodes
    }
    median = float(np.median(list(ratio.values())))
    worst = sorted(ratio.items(), key=lambda kv: -kv[1])[: max(1, int(len(nodes) * max_fraction))]
    return [(n, r) for n, r in worst if r > 2 * median]


def _op_subsets(model: Path) -> dict[str, list[str]]:
    """Operator subsets worth trying beyond 'all': only those present and different from all."""
    import onnx

    ops = {n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    subsets = {"matmul": ["MatMul", "Gemm"], "conv": ["Conv"]}
    quantizable = ops & {"MatMul", "Gemm", "Conv", "Add", "Mul", "Gather", "Relu", "MaxPool", "Concat"}
    return {k: v for k, v in subsets.items() if ops & set(v) and (quantizable - set(v))}


def quantizable_nodes(model: Path, calib: list[Feeds] | None) -> list[str]:
    """Names of the nodes with a constant weight that INT8 quantizes (activation-by-activation
    MatMuls in attention are left out: dynamic INT8 does not quantize them), worst outliers
    first (the ``sensitive_nodes`` heuristic, when calibration data is there), then graph order."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    consts = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type in ("Constant", "DequantizeLinear") for o in n.output
    }
    nodes = [n.name for n in graph.node if n.op_type in WEIGHT_OPS and consts & set(n.input[1:])]
    prior = [n for n, _ in sensitive_nodes(model, calib, max_fraction=1.0)] if calib else []
    return [n for n in prior if n in nodes] + [n for n in nodes if n not in prior]


class SearchContext:
    """What an accuracy-aware search needs: the full scorer, a damage function on a slice of
    EVAL, the quality to reach, and the time each search may take (``budget_s``)."""

    def __init__(
        self,
        score: Scorer,
        damage: Callable[[Any], float],
        target: float,
        budget_s: float,
    ) -> None:
        self.score, self.damage, self.target = score, damage, target
        self.budget_s = budget_s


def static_search(
    source: Path,
    out_dir: Path,
    calib: list[Feeds] | None,
    scorer: Scorer | None,
    progress: Progress = quiet,
    wanted: Callable[[str], bool] = lambda _: True,
    search: SearchContext | None = None,
) -> list[Variant]:
    """Static INT8 variants as the module docstring says; failures become skipped variants."""
    names = [f"int8_static_{m.lower()}" for m in STATIC_METHODS]
    if not any(wanted(n) for n in names):
        return []
    if not calib:
        return [
            Variant(n, None, skipped="static INT8 needs calibration data (--calibration)")
            for n in names
            if wanted(n)
        ]
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        pre = preprocessed(source, out_dir / "static.onnx")
        pre, clamped, fp32_nodes = clamp_nonfinite(pre, out_dir / "static.finite.onnx", calib)
    except Exception as exc:
        reason = f"shape-inference pre-processing failed: {type(exc).__name__}: {exc}"
        return [Variant(n, None, skipped=reason) for n in names if wanted(n)]
    clamp_note = (
        f"; {clamped} infinite or ±3.4e38 constants (attention masks) clamped to ±1e4 for calibration, "
        f"the {len(fp32_nodes)} node(s) adding them kept in FP32"
        if clamped
        else ""
    )
    variants: list[Variant] = []
    quality: dict[str, float] = {}

    def attempt(name: str, method: str, note: str, **kw: Any) -> None:
        progress.stage(name)
        out = out_dir / f"{name}.onnx"
        kw["exclude"] = fp32_nodes + kw.get("exclude", [])
        try:
            _quantize_static(pre, out, calib, method, progress, **kw)
        except Exception as exc:
            log.warning("variant %s skipped: %s", name, exc)
            variants.append(Variant(name, None, skipped=f"{type(exc).__name__}: {exc}"))
            return
        variants.append(
            Variant(
                name,
                out,
                f"static INT8 (QDQ), {method} calibration on {len(calib)} batches{note}{clamp_note}",
            )
        )
        if scorer is not None:
            quality[name] = scorer(out)

    for method, name in zip(STATIC_METHODS, names, strict=True):
        if wanted(name):
            attempt(name, method, ", all operators")
    if scorer is None or not quality:
        return variants
    best = max(quality, key=lambda n: quality[n])
    method = STATIC_METHODS[names.index(best)]
    subsets: dict[str, list[str] | None] = {best: None}
    for subset, ops in _op_subsets(pre).items():
        attempt(f"{best}_{subset}", method, f", only {'/'.join(ops)}", op_types=ops)
        subsets[f"{best}_{subset}"] = ops
    base = max((n for n in subsets if n in quality), key=lambda n: quality[n])
    if search is None or quality[base] >= search.target or search.budget_s <= 0:
        return variants
    chosen = subsets[base]
    serial = itertools.count(1)

    def build(keep: list[str], only: str | None) -> Path:
        out = out_dir / f"{base}_search_{next(serial)}.onnx"
        with hushed():
            _quantize_static(
                pre,
                out,
                calib,
                method,
                quiet,
                op_types=chosen,
                exclude=fp32_nodes + keep,
                only=[only] if only else None,
            )
        return out

    progress.stage(f"{base}_acc: accuracy-aware search (budget {search.budget_s:.0f} s)")
    nodes = quantizable_nodes(pre, calib)
    found = restore_search(
        build, nodes, search.score, search.damage, search.target, search.budget_s, progress, f"{base}_acc"
    )
    variants.append(
        searched_variant(
            f"{base}_acc",
            found,
            f"static INT8 (QDQ), {method}" + (f", only {'/'.join(chosen)}" if chosen else "") + clamp_note,
        )
    )
    return variants


def searched_variant(name: str, found: Any, what: str) -> Variant:
    spent = sum(s.seconds for s in found.steps)
    how = (
        f"{found.ranked} of {found.candidates} nodes ranked by measured damage"
        + (", the rest by activation outliers" if found.ranked < found.candidates else "")
        + f"; {len(found.steps)} steps, {spent:.0f} s"
    )
    if found.kept is not None and len(found.kept) == found.candidates:
        return Variant(
            name,
            None,
            skipped=f"only keeping all {found.candidates} weight nodes in FP32 restored tolerance: nothing "
            f"would be left to quantize ({how})",
            search=found.steps,
        )
    if found.kept is None:
        tried_all = any(s.kept_fp32 == found.candidates for s in found.steps)
        why = "no set of FP32 nodes reached tolerance" + ("" if tried_all else " within the budget")
        return Variant(
            name,
            None,
            skipped=f"{why} ({how})",
            search=found.steps,
        )
    return Variant(
        name,
        found.path,
        f"{what}, {len(found.kept)} of {found.candidates} weight nodes kept in FP32, "
        f"chosen by measured accuracy ({how}): {', '.join(found.kept[:4])}"
        + (f" and {len(found.kept) - 4} more" if len(found.kept) > 4 else ""),
        search=found.steps,
    )
