"""OpenVINO variants: the CPU plugin at f32 and bf16 (precision pinned: OpenVINO picks
bf16 by itself on CPUs that have it), NNCF post-training INT8, NNCF's accuracy-control
INT8 when plain INT8 loses too much, and NNCF INT4 weight compression. Each is a
model file that ``milliserve serve`` loads through its ``openvino`` backend."""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.optimize.cpu import CpuInfo
from milliserve.optimize.measure import EvalSet, score
from milliserve.optimize.progress import Progress, hushed, quiet
from milliserve.optimize.variant import Feeds, SearchStep, Variant

__all__ = ["AccuracyControl", "openvino_variants"]

log = logging.getLogger(__name__)
NAMES = ("openvino_f32", "openvino_bf16", "nncf_int8", "nncf_int8_acc", "nncf_int4")


class AccuracyControl:
    """What NNCF's accuracy control needs: EVAL, the metric and FP32's outputs and score."""

    def __init__(
        self,
        data: EvalSet,
        metric: str,
        reference: np.ndarray,
        quality: float,
        tolerance: float,
    ) -> None:
        self.data, self.metric, self.reference = data, metric, reference
        self.quality, self.tolerance = quality, tolerance


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
    control: AccuracyControl | None = None,
    quality_of: Callable[[Variant], float] | None = None,
) -> list[Variant]:
    """OpenVINO f32 and bf16 (precision pinned: OpenVINO picks bf16 by itself on CPUs that
    have it) and NNCF post-training INT8, when openvino / nncf are installed."""
    names = [n for n in NAMES if wanted(n)]
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
    plain = next((v for v in out if v.name == "nncf_int8" and v.path is not None), None)
    if (
        "nncf_int8_acc" in names
        and calib
        and plain is not None
        and control is not None
        and quality_of is not None
        and quality_of(plain) < control.quality - control.tolerance
    ):
        progress.stage("nncf_int8_acc: NNCF accuracy control")
        try:
            out.append(_nncf_accuracy_control(source, out_dir / "nncf_int8_acc.xml", calib, control))
        except Exception as exc:
            log.warning("variant nncf_int8_acc skipped: %s", exc)
            out.append(Variant("nncf_int8_acc", None, skipped=f"{type(exc).__name__}: {exc}"))
    if "nncf_int4" in names:
        progress.stage("nncf_int4")
        try:
            out.append(_nncf_int4(source, out_dir / "nncf_int4.xml"))
        except Exception as exc:
            log.warning("variant nncf_int4 skipped: %s", exc)
            out.append(Variant("nncf_int4", None, skipped=f"{type(exc).__name__}: {exc}"))
    return out


def _nncf_int8(source: Path, out: Path, calib: list[Feeds]) -> Variant:
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(source))
    kind = nncf.ModelType.TRANSFORMER if _bert_like(source) else None
    with hushed():
        quantized = nncf.quantize(
            model, nncf.Dataset(calib), subset_size=len(calib), model_type=kind, fast_bias_correction=True
        )
    ov.save_model(quantized, str(out), compress_to_fp16=False)
    what = "transformer preset" if kind else "default preset"
    return Variant(
        "nncf_int8",
        out,
        f"NNCF post-training INT8 ({what}, {len(calib)} calibration batches), OpenVINO with f32 pinned",
        runtime="openvino",
        precision="f32",
    )


def _nncf_accuracy_control(source: Path, out: Path, calib: list[Feeds], control: AccuracyControl) -> Variant:
    """``nncf.quantize_with_accuracy_control``: INT8, then NNCF ranks the quantized layers
    on EVAL and reverts the worst to FP32 until the drop is within tolerance."""
    import nncf
    import openvino as ov

    data, chunk = control.data, 64
    if data.fixed_batch:
        raise ValueError("NNCF accuracy control is not run on a model whose batch size is fixed")
    items = [
        ({k: v[i : i + chunk] for k, v in data.inputs.items()}, slice(i, i + chunk))
        for i in range(0, data.rows, chunk)
    ]

    def validate(compiled: Any, batch: Any) -> float:
        got, rows = [], []
        for feeds, where in batch:
            got.append(np.asarray(compiled(feeds)[0]))
            rows.append(np.arange(data.rows)[where])
        idx = np.concatenate(rows)
        subset = EvalSet(
            {k: v[idx] for k, v in data.inputs.items()}, None if data.labels is None else data.labels[idx]
        )
        return score(control.metric, np.concatenate(got), subset, control.reference[idx])

    model = ov.Core().read_model(str(source))
    started = time.monotonic()
    with hushed():
        quantized = nncf.quantize_with_accuracy_control(
            model,
            nncf.Dataset(calib),
            nncf.Dataset(items),
            validate,
            max_drop=control.tolerance,
            drop_type=nncf.DropType.ABSOLUTE,
            subset_size=len(calib),
            model_type=nncf.ModelType.TRANSFORMER if _bert_like(source) else None,
        )
    ov.save_model(quantized, str(out), compress_to_fp16=False)
    spent = time.monotonic() - started
    quantizers = sum(1 for op in quantized.get_ordered_ops() if op.get_type_name() == "FakeQuantize")
    return Variant(
        "nncf_int8_acc",
        out,
        f"NNCF INT8 with accuracy control (max drop {control.tolerance}, layers ranked and reverted "
        f"to FP32 by NNCF on EVAL; {quantizers} quantizers remain; {spent:.0f} s), OpenVINO with f32 pinned",
        runtime="openvino",
        precision="f32",
        search=[SearchStep("nncf.quantize_with_accuracy_control", 0, float("nan"), spent)],
    )


def _nncf_int4(source: Path, out: Path) -> Variant:
    """Weight-only INT4 (symmetric, groups of 32): it mostly saves memory; on a small
    encoder the CPU may run it no faster than FP32, and the report will show that."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(source))
    group = "group 32"
    with hushed():
        try:
            compressed = nncf.compress_weights(
                model, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=32, ratio=1.0
            )
        except nncf.InvalidGroupSizeError:  # an input width that 32 does not divide (a 120-feature MLP)
            model = ov.Core().read_model(str(source))
            compressed = nncf.compress_weights(
                model, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=-1, ratio=1.0
            )
            group = "per output channel (32 does not divide an input width)"
    ov.save_model(compressed, str(out), compress_to_fp16=False)
    return Variant(
        "nncf_int4",
        out,
        f"NNCF INT4 weight-only (symmetric, {group}; embeddings and the last layer stay INT8), "
        "OpenVINO with f32 activations",
        runtime="openvino",
        precision="f32",
    )
