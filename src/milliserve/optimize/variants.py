"""Build the variants of an ONNX model: FP32, ONNX Runtime graph-optimised, the
transformer fusions for BERT-like models, FP16, dynamic INT8 (and its accuracy-aware
search), INT4 weight-only, static INT8 (``static_int8``) and OpenVINO / NNCF
(``openvino_variants``) when they are installed.

Every builder either returns a model file or a reason it was skipped; one
failing never stops the others.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from milliserve.optimize.accuracy_search import restore_search
from milliserve.optimize.cpu import CpuInfo
from milliserve.optimize.graph_prep import preprocessed
from milliserve.optimize.openvino_variants import AccuracyControl, openvino_variants
from milliserve.optimize.progress import Progress, hushed, quiet
from milliserve.optimize.static_int8 import SearchContext, quantizable_nodes, searched_variant, static_search
from milliserve.optimize.variant import Feeds, Scorer, Skip, Variant

__all__ = ["Variant", "build_variants", "wanted_by"]

log = logging.getLogger(__name__)


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
        with hushed():
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
    if _has_attention_softmax(source):
        raise Skip(
            "ONNX Runtime's BERT fusion did not recognise this graph's attention (a transformers "
            "export with SDPA attention is not a pattern it knows); export a PyTorch source "
            "through milliserve, which exports with eager attention, to get the fused graph"
        )
    raise Skip("no BERT-like attention found to fuse")


def _has_attention_softmax(model: Path) -> bool:
    import onnx

    ops = {n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    return "Softmax" in ops and "MatMul" in ops


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


def _int8_dynamic(source: Path, out: Path, cpu: CpuInfo, _: list[Feeds] | None) -> tuple[Path, str]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pre = preprocessed(source, out)
    weight = QuantType.QInt8 if cpu.vnni else QuantType.QUInt8
    with hushed():
        quantize_dynamic(str(pre), str(out), per_channel=True, weight_type=weight, reduce_range=not cpu.vnni)
    pre.unlink(missing_ok=True)
    kind = "S8 per-channel weights (VNNI)" if cpu.vnni else "U8 weights with reduce_range (no VNNI)"
    return out, f"dynamic INT8, {kind}"


def _int4_weight_only(source: Path, out: Path, _: CpuInfo, __: list[Feeds] | None) -> tuple[Path, str]:
    """ONNX Runtime's 4-bit MatMul weights (MatMulNBits, symmetric, blocks of 32, int8
    compute). It is built for LLM-sized MatMuls; a small encoder may run no faster."""
    import onnx

    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:
        raise Skip(f"onnxruntime's 4-bit quantizer cannot be imported ({exc}); pip install onnx-ir") from None
    model = onnx.load(str(source))
    with hushed():
        quant = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=True, accuracy_level=4)
        quant.process()
    done = sum(1 for n in quant.model.model.graph.node if n.op_type == "MatMulNBits")
    if not done:
        raise Skip("no MatMul with a constant weight (the 4-bit quantizer takes MatMul, not Gemm or Conv)")
    quant.model.save_model_to_file(str(out), use_external_data_format=False)
    return out, f"INT4 weight-only (MatMulNBits on {done} MatMuls, symmetric, block 32, int8 compute)"


Builder = Callable[[Path, Path, CpuInfo, list[Feeds] | None], tuple[Path, str]]
BUILDERS: dict[str, Builder] = {
    "fp32": _fp32,
    "ort_optimized": _ort_optimized,
    "bert_fused": _bert_fused,
    "fp16": _fp16,
    "int8_dynamic": _int8_dynamic,
    "int4_weight_only": _int4_weight_only,
}


def wanted_by(only: list[str] | None) -> Callable[[str], bool]:
    """``--variant`` filter: a name is wanted when listed, or when it extends a listed name."""
    return lambda name: not only or any(name == o or name.startswith(o + "_") for o in only)


def dynamic_search(
    base: Path,
    out_dir: Path,
    cpu: CpuInfo,
    calib: list[Feeds] | None,
    search: SearchContext,
    progress: Progress,
    name: str,
) -> Variant:
    """Dynamic INT8 with the measured set of weight nodes kept in FP32 (``accuracy_search``)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pre = preprocessed(base, out_dir / f"{name}.onnx")
    weight = QuantType.QInt8 if cpu.vnni else QuantType.QUInt8
    serial = itertools.count(1)

    def also_rewritten(names: list[str]) -> list[str]:
        # the dynamic quantizer first splits a Gemm into MatMul + Add named <gemm>_MatMul and
        # matches exclusions against those names; list both so a Gemm (nn.Linear) is matched
        return names + [f"{n}_MatMul" for n in names]

    def build(keep: list[str], only: str | None) -> Path:
        keep, only_names = also_rewritten(keep), also_rewritten([only]) if only else None
        out = out_dir / f"{name}_{next(serial)}.onnx"
        with hushed():
            quantize_dynamic(
                str(pre),
                str(out),
                per_channel=True,
                weight_type=weight,
                reduce_range=not cpu.vnni,
                nodes_to_exclude=keep,
                nodes_to_quantize=only_names,
            )
        return out

    progress.stage(f"{name}: accuracy-aware search (budget {search.budget_s:.0f} s)")
    found = restore_search(
        build,
        quantizable_nodes(pre, calib),
        search.score,
        search.damage,
        search.target,
        search.budget_s,
        progress,
        name,
    )
    return searched_variant(name, found, "dynamic INT8")


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
    search: SearchContext | None = None,
    control: AccuracyControl | None = None,
) -> list[Variant]:
    """Build each variant into ``out_dir``; failures become skipped variants with the reason.

    ``prefix`` names the variants of a derived model (``student_int8_dynamic``);
    ``builders`` limits which builders run on it. INT8 dynamic quantizes the fastest FP32
    graph available (the BERT-fused one when it exists). With a ``search`` context, an
    INT8 variant out of tolerance is followed by its accuracy-aware search (``_acc``)."""
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
                base if name in ("int8_dynamic", "int4_weight_only") else source,
                out_dir / f"{full}.onnx",
                cpu,
                calibration,
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
        if (
            name == "int8_dynamic"
            and search is not None
            and scorer is not None
            and wanted(full + "_acc")
            and search.budget_s > 0
            and scorer(path) < search.target
        ):
            try:
                variants.append(
                    dynamic_search(base, out_dir, cpu, calibration, search, progress, full + "_acc")
                )
            except Exception as exc:
                log.warning("variant %s_acc skipped: %s", full, exc)
                variants.append(Variant(full + "_acc", None, skipped=f"{type(exc).__name__}: {exc}"))
    if builders is None or "int8_static" in builders:
        variants += [
            Variant(prefix + v.name, v.path, v.note, v.skipped, search=v.search)
            for v in static_search(
                source,
                out_dir,
                calibration,
                scorer,
                progress,
                lambda n: wanted(prefix + n),
                search if builders is None else None,
            )
        ]
    if builders is None:
        quality_of = (lambda v: scorer(v.ref)) if scorer is not None else None
        variants += openvino_variants(
            source, out_dir, cpu, calibration, wanted, progress, control, quality_of
        )
    return variants
