"""Build the variants of an ONNX model: FP32, ONNX Runtime graph-optimised, FP16,
dynamic INT8 and static INT8 (QDQ, a search over calibration methods).

Every builder either returns a model file or a reason it was skipped; one
failing never stops the others.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.optimize.cpu import CpuInfo

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


def _fp32(source: Path, out: Path, _: CpuInfo, __: list[Feeds] | None) -> tuple[Path, str]:
    shutil.copy(source, out)
    return out, "the source model"


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
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = out.with_name(out.stem + ".pre.onnx")
    quant_pre_process(str(source), str(pre), auto_merge=True)
    return pre


def _int8_dynamic(source: Path, out: Path, cpu: CpuInfo, _: list[Feeds] | None) -> tuple[Path, str]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pre = _preprocessed(source, out)
    weight = QuantType.QInt8 if cpu.vnni else QuantType.QUInt8
    quantize_dynamic(str(pre), str(out), per_channel=True, weight_type=weight, reduce_range=not cpu.vnni)
    pre.unlink(missing_ok=True)
    kind = "S8 per-channel weights (VNNI)" if cpu.vnni else "U8 weights with reduce_range (no VNNI)"
    return out, f"dynamic INT8, {kind}"


class _Reader:
    """Calibration batches for onnxruntime.quantization."""

    def __init__(self, batches: list[Feeds]) -> None:
        self._it: Iterator[Feeds] = iter(batches)

    def get_next(self) -> Feeds | None:
        return next(self._it, None)


def _int8_static(method: str) -> Callable[[Path, Path, CpuInfo, list[Feeds] | None], tuple[Path, str]]:
    def build(source: Path, out: Path, cpu: CpuInfo, calib: list[Feeds] | None) -> tuple[Path, str]:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        if not calib:
            raise ValueError("static INT8 needs calibration data (--calibration)")
        pre = _preprocessed(source, out)
        quantize_static(
            str(pre),
            str(out),
            _Reader(calib),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, method),
        )
        pre.unlink(missing_ok=True)
        return out, f"static INT8 (QDQ), {method} calibration on {len(calib)} batches"

    return build


BUILDERS: dict[str, Callable[[Path, Path, CpuInfo, list[Feeds] | None], tuple[Path, str]]] = {
    "fp32": _fp32,
    "ort_optimized": _ort_optimized,
    "fp16": _fp16,
    "int8_dynamic": _int8_dynamic,
    **{f"int8_static_{m.lower()}": _int8_static(m) for m in STATIC_METHODS},
}


def build_variants(
    source: Path,
    out_dir: Path,
    cpu: CpuInfo,
    calibration: list[Feeds] | None = None,
    only: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Variant]:
    """Build each variant into ``out_dir``; failures become skipped variants with the reason."""
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = []
    for name, builder in BUILDERS.items():
        if only and name not in only:
            continue
        if progress:
            progress(name)
        try:
            path, note = builder(source, out_dir / f"{name}.onnx", cpu, calibration)
            variants.append(Variant(name, path, note))
        except Exception as exc:  # a variant that cannot be built is reported, never fatal
            log.warning("variant %s skipped: %s", name, exc)
            variants.append(Variant(name, None, skipped=f"{type(exc).__name__}: {exc}"))
    return variants
