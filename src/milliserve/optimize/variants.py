"""Build the variants of an ONNX model: FP32, ONNX Runtime graph-optimised, the
transformer fusions for BERT-like models, FP16, dynamic INT8, static INT8 (QDQ, a
search over calibration methods, operator subsets and excluded sensitive nodes) and
OpenVINO / NNCF when they are installed.

Every builder either returns a model file or a reason it was skipped; one
failing never stops the others.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.optimize.cpu import CpuInfo
from milliserve.optimize.measure import ModelRef
from milliserve.optimize.progress import Progress, quiet

__all__ = ["Variant", "build_variants"]

log = logging.getLogger(__name__)
Feeds = dict[str, np.ndarray[Any, Any]]
STATIC_METHODS = ("MinMax", "Entropy", "Percentile")


@dataclass
class Variant:
    name: str
    path: Path | None
    note: str = ""
    skipped: str = ""  # why it was not built
    runtime: str = "onnxruntime"  # or "openvino": how measure/predict run it
    precision: str = ""  # OpenVINO inference precision hint, pinned

    @property
    def ref(self) -> ModelRef:
        assert self.path is not None, f"{self.name} was not built"
        return ModelRef(self.path, self.runtime, self.precision)


class Skip(Exception):
    """The variant does not apply to this model; the message says why."""


# The quality of a candidate model file on EVAL (accuracy or cosine); used by the static search.
Scorer = Callable[[Path | ModelRef], float]


def _fp32(source: Path, out: Path, _: CpuInfo, __: list[Feeds] | None) -> tuple[Path, str]:
    shutil.copy(source, out)
    return out, "the source model"


def _probe_feeds(model: Path) -> Feeds:
    """Synthetic inputs to check a rewritten graph against its source: token ids, a full mask."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    feeds: Feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else (2 if k == 0 else 16) for k, d in enumerate(i.shape)]
        if "int" in i.type:
            dtype = np.int64 if "64" in i.type else np.int32
            feeds[i.name] = (
                np.ones(shape, dtype) if "mask" in i.name else rng.integers(1, 100, shape).astype(dtype)
            )
            if "type" in i.name:
                feeds[i.name] = np.zeros(shape, dtype)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _same_outputs(a: Path, b: Path, feeds: Feeds, atol: float = 1e-3) -> bool:
    import onnxruntime as ort

    ra = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"]).run(None, feeds)
    rb = ort.InferenceSession(str(b), providers=["CPUExecutionProvider"]).run(None, feeds)
    return all(x.shape == y.shape and np.allclose(x, y, atol=atol) for x, y in zip(ra, rb, strict=True))


def _hidden_size(model: Path) -> int:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model))
    inits = {i.name: i for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "LayerNormalization" and len(n.input) > 1 and n.input[1] in inits:
            return int(numpy_helper.to_array(inits[n.input[1]]).shape[0])
    return 0


def _bert_fused(source: Path, out: Path, _: CpuInfo, __: list[Feeds] | None) -> tuple[Path, str]:
    """ONNX Runtime's transformer fusions. The head count is read from the graph when it
    can be; exported models often reshape with -1 heads, so other head sizes are tried
    and each fused graph must give the source's outputs before it is kept."""
    from onnxruntime.transformers.optimizer import optimize_model

    hidden = _hidden_size(source)
    tries = [(0, 0)] + [(hidden // hs, hidden) for hs in (64, 32, 128, 16, 8) if hidden and hidden % hs == 0]
    feeds = _probe_feeds(source)
    for heads, size in tries:
        with _hushed():
            model = optimize_model(
                str(source), model_type="bert", num_heads=heads, hidden_size=size, opt_level=1
            )
        fused = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
        if not (fused.get("Attention") or fused.get("MultiHeadAttention")):
            continue
        model.save_model_to_file(str(out))
        if _same_outputs(source, out, feeds):
            ops = ", ".join(f"{v} {k}" for k, v in sorted(fused.items()) if k in ATTENTION_FUSIONS)
            heads_note = f", {heads} heads" if heads else ""
            return out, f"ONNX Runtime transformer fusions for BERT ({ops}{heads_note})"
    out.unlink(missing_ok=True)
    raise Skip("no BERT-like attention found to fuse")


ATTENTION_FUSIONS = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "EmbedLayerNormalization",
    "Gelu",
    "FastGelu",
    "BiasGelu",
)


def _ort_optimized(source: Path, out: Path, _: CpuInfo, __: list[Feeds] | None) -> tuple[Path, str]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"])
    return out, "ONNX Runtime extended graph optimisations (fusions) saved offline"


def _fp16(source: Path, out: Path, _: CpuInfo, __: list[Feeds] | None) -> tuple[Path, str]:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(model, str(out))
    return out, "FP16 weights and compute; CPUs rarely run it faster than FP32"


def _preprocessed(source: Path, out: Path) -> Path:
    """Symbolic shape inference (``auto_merge``) and basic graph optimisation before
    quantizing; a graph already fused for transformers is not optimised again."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = out.with_name(out.stem + ".pre.onnx")
    fused = any(
        n.domain == "com.microsoft" for n in onnx.load(str(source), load_external_data=False).graph.node
    )
    with _hushed():
        quant_pre_process(str(source), str(pre), auto_merge=True, skip_optimization=fused)
    return pre


def _int8_dynamic(source: Path, out: Path, cpu: CpuInfo, _: list[Feeds] | None) -> tuple[Path, str]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pre = _preprocessed(source, out)
    weight = QuantType.QInt8 if cpu.vnni else QuantType.QUInt8
    with _hushed():
        quantize_dynamic(str(pre), str(out), per_channel=True, weight_type=weight, reduce_range=not cpu.vnni)
    pre.unlink(missing_ok=True)
    kind = "S8 per-channel weights (VNNI)" if cpu.vnni else "U8 weights with reduce_range (no VNNI)"
    return out, f"dynamic INT8, {kind}"


@contextmanager
def _hushed() -> Iterator[None]:
    """onnxruntime.quantization warns through the root logger (one line per LayerNorm weight)
    and prints its calibration steps; keep them out of the user's progress display."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as sink, redirect_stdout(sink):
            yield
    finally:
        root.setLevel(level)


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
) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with progress.steps(f"calibrating {out.stem}", len(calib)) as advance, _hushed():
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


def static_search(
    source: Path,
    out_dir: Path,
    calib: list[Feeds] | None,
    scorer: Scorer | None,
    progress: Progress = quiet,
    wanted: Callable[[str], bool] = lambda _: True,
) -> list[Variant]:
    """Static INT8 (QDQ) as a search: each calibration method over all operators; then,
    for the best method, each operator subset and the exclusion of the sensitive nodes."""
    names = [f"int8_static_{m.lower()}" for m in STATIC_METHODS]
    if not any(wanted(n) for n in names):
        return []
    if not calib:
        return [
            Variant(n, None, skipped="static INT8 needs calibration data (--calibration)")
            for n in names
            if wanted(n)
        ]
    try:
        pre = _preprocessed(source, out_dir / "static.onnx")
    except Exception as exc:
        reason = f"shape-inference pre-processing failed: {type(exc).__name__}: {exc}"
        return [Variant(n, None, skipped=reason) for n in names if wanted(n)]
    variants: list[Variant] = []
    quality: dict[str, float] = {}

    def attempt(name: str, method: str, note: str, **kw: Any) -> None:
        progress.stage(name)
        out = out_dir / f"{name}.onnx"
        try:
            _quantize_static(pre, out, calib, method, progress, **kw)
        except Exception as exc:
            log.warning("variant %s skipped: %s", name, exc)
            variants.append(Variant(name, None, skipped=f"{type(exc).__name__}: {exc}"))
            return
        variants.append(
            Variant(name, out, f"static INT8 (QDQ), {method} calibration on {len(calib)} batches{note}")
        )
        if scorer is not None:
            quality[name] = scorer(out)

    for method, name in zip(STATIC_METHODS, names, strict=True):
        if wanted(name):
            attempt(name, method, ", all operators")
    if scorer is not None and quality:
        best = max(quality, key=lambda n: quality[n])
        method = STATIC_METHODS[names.index(best)]
        subsets: dict[str, list[str] | None] = {best: None}
        for subset, ops in _op_subsets(pre).items():
            attempt(f"{best}_{subset}", method, f", only {'/'.join(ops)}", op_types=ops)
            subsets[f"{best}_{subset}"] = ops
        # then keep the sensitive nodes in FP32, on top of the best operator subset so far
        base = max((n for n in subsets if n in quality), key=lambda n: quality[n])
        sensitive = sensitive_nodes(pre, calib)
        if sensitive:
            shown = ", ".join(f"{n} ({r:.0f}x)" for n, r in sensitive[:4])
            more = f" and {len(sensitive) - 4} more" if len(sensitive) > 4 else ""
            chosen = subsets[base]
            only = f", only {'/'.join(chosen)}" if chosen else ""
            attempt(
                f"{base}_exclude",
                method,
                f"{only}, {len(sensitive)} sensitive MatMuls kept in FP32 "
                f"(max/rms of their input: {shown}{more})",
                op_types=chosen,
                exclude=[n for n, _ in sensitive],
            )
    pre.unlink(missing_ok=True)
    return variants


def _bert_like(model: Path) -> bool:
    import onnx

    ops = {n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    return "Softmax" in ops and bool(ops & {"Erf", "Gelu", "FastGelu", "BiasGelu"})


def openvino_variants(
    source: Path,
    out_dir: Path,
    cpu: CpuInfo,
    calib: list[Feeds] | None,
    wanted: Callable[[str], bool],
    progress: Progress = quiet,
) -> list[Variant]:
    """OpenVINO f32 and bf16 (precision pinned: OpenVINO picks bf16 by itself on CPUs that
    have it) and NNCF post-training INT8, when openvino / nncf are installed."""
    names = [n for n in ("openvino_f32", "openvino_bf16", "nncf_int8") if wanted(n)]
    if not names:
        return []
    if importlib.util.find_spec("openvino") is None:
        return [
            Variant(n, None, skipped="openvino is not installed (pip install openvino nncf)") for n in names
        ]
    out: list[Variant] = []
    for name, precision in (("openvino_f32", "f32"), ("openvino_bf16", "bf16")):
        if name not in names:
            continue
        if precision == "bf16" and not cpu.bf16:
            out.append(Variant(name, None, skipped="this CPU has no bf16 instructions"))
            continue
        out.append(
            Variant(
                name,
                source,
                f"OpenVINO CPU plugin, INFERENCE_PRECISION_HINT={precision} pinned",
                runtime="openvino",
                precision=precision,
            )
        )
    if "nncf_int8" in names:
        progress.stage("nncf_int8")
        if importlib.util.find_spec("nncf") is None:
            out.append(Variant("nncf_int8", None, skipped="nncf is not installed (pip install nncf)"))
        elif not calib:
            out.append(Variant("nncf_int8", None, skipped="NNCF INT8 needs calibration data (--calibration)"))
        else:
            try:
                out.append(_nncf_int8(source, out_dir / "nncf_int8.xml", calib))
            except Exception as exc:
                log.warning("variant nncf_int8 skipped: %s", exc)
                out.append(Variant("nncf_int8", None, skipped=f"{type(exc).__name__}: {exc}"))
    return out


def _nncf_int8(source: Path, out: Path, calib: list[Feeds]) -> Variant:
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(source))
    kind = nncf.ModelType.TRANSFORMER if _bert_like(source) else None
    with _hushed():
        quantized = nncf.quantize(
            model, nncf.Dataset(calib), subset_size=len(calib), model_type=kind, fast_bias_correction=True
        )
    ov.save_model(quantized, str(out))
    what = "transformer preset" if kind else "default preset"
    return Variant(
        "nncf_int8",
        out,
        f"NNCF post-training INT8 ({what}, {len(calib)} calibration batches), OpenVINO with f32 pinned",
        runtime="openvino",
        precision="f32",
    )


Builder = Callable[[Path, Path, CpuInfo, list[Feeds] | None], tuple[Path, str]]
BUILDERS: dict[str, Builder] = {
    "fp32": _fp32,
    "ort_optimized": _ort_optimized,
    "bert_fused": _bert_fused,
    "fp16": _fp16,
    "int8_dynamic": _int8_dynamic,
}


def wanted_by(only: list[str] | None) -> Callable[[str], bool]:
    """``--variant`` filter: a name is wanted when listed, or when it extends a listed name."""
    return lambda name: not only or any(name == o or name.startswith(o + "_") for o in only)


def build_variants(
    source: Path,
    out_dir: Path,
    cpu: CpuInfo,
    calibration: list[Feeds] | None = None,
    only: list[str] | None = None,
    progress: Progress = quiet,
    scorer: Scorer | None = None,
    prefix: str = "",
    builders: tuple[str, ...] | None = None,
) -> list[Variant]:
    """Build each variant into ``out_dir``; failures become skipped variants with the reason.

    ``prefix`` names the variants of a derived model (``student_int8_dynamic``);
    ``builders`` limits which builders run on it. INT8 dynamic quantizes the fastest FP32
    graph available (the BERT-fused one when it exists)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = wanted_by(only)
    variants: list[Variant] = []
    base = source
    for name, builder in BUILDERS.items():
        full = prefix + name
        if (builders is not None and name not in builders) or not wanted(full):
            continue
        progress.stage(full)
        try:
            path, note = builder(
                base if name == "int8_dynamic" else source, out_dir / f"{full}.onnx", cpu, calibration
            )
        except Skip as exc:
            variants.append(Variant(full, None, skipped=str(exc)))
            continue
        except Exception as exc:  # a variant that cannot be built is reported, never fatal
            log.warning("variant %s skipped: %s", full, exc)
            variants.append(Variant(full, None, skipped=f"{type(exc).__name__}: {exc}"))
            continue
        if name == "bert_fused":
            base = path
            note += "; INT8 dynamic quantizes this graph"
        variants.append(Variant(full, path, note))
    if builders is None or "int8_static" in builders:
        variants += [
            Variant(prefix + v.name, v.path, v.note, v.skipped)
            for v in static_search(
                source, out_dir, calibration, scorer, progress, lambda n: wanted(prefix + n)
            )
        ]
    if builders is None:
        variants += openvino_variants(source, out_dir, cpu, calibration, wanted, progress)
    return variants
