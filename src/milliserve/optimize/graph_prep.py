"""Preparing an ONNX graph for quantization: symbolic shape inference, and finite
constants where an exported attention mask adds -inf (or float32's lowest value).

Histogram calibrators (Entropy, Percentile) cannot bin a range of [-inf, x], and MinMax
turns a range of [-3.4e38, x] into a useless scale. BERT's own code used -10000 for the
same purpose: after a softmax both are exactly zero in float32, which the clamp checks
on real inputs before it is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from milliserve.optimize.progress import hushed
from milliserve.optimize.variant import Feeds

__all__ = ["clamp_nonfinite", "preprocessed"]

HUGE = 1e30  # a constant this large is a stand-in for infinity
CLAMP = 1e4


def preprocessed(source: Path, out: Path) -> Path:
    """Symbolic shape inference (``auto_merge``) and basic graph optimisation before
    quantizing; a graph already fused for transformers is not optimised again."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = out.with_name(out.stem + ".pre.onnx")
    fused = any(
        n.domain == "com.microsoft" for n in onnx.load(str(source), load_external_data=False).graph.node
    )
    with hushed():
        quant_pre_process(str(source), str(pre), auto_merge=True, skip_optimization=fused)
    return pre


def _clamped(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    if arr.dtype.kind != "f":
        return None
    bad = ~np.isfinite(arr) | (np.abs(arr) >= HUGE)
    if not bad.any():
        return None
    out = arr.copy()
    out[bad & ~(arr < 0)] = CLAMP  # +inf, +huge (and NaN, which no mask uses) become +1e4
    out[bad & (arr < 0)] = -CLAMP
    return out


def clamp_nonfinite(source: Path, out: Path, check: list[Feeds]) -> tuple[Path, int, list[str]]:
    """A copy of ``source`` whose infinite or |x| >= 1e30 float constants are ±1e4, how many
    constants changed, and the nodes that read them (named, if they were not). Those nodes
    must stay in FP32: their outputs span [-1e4, x], which no 8-bit grid holds. The copy is
    used only when its outputs on ``check`` equal the source's; otherwise (or when nothing
    needed clamping) ``(source, 0, [])``."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    changed: set[str] = set()  # names of the tensors (constant outputs) that were clamped
    tensors = [(t, t.name) for t in model.graph.initializer]
    for node in model.graph.node:
        if node.op_type in ("Constant", "ConstantOfShape"):
            values = [a.t for a in node.attribute if a.name == "value" and a.HasField("t")]
            tensors += [(t, node.output[0]) for t in values]
    for t, produced in tensors:
        fixed = _clamped(numpy_helper.to_array(t))
        if fixed is not None:
            t.CopyFrom(numpy_helper.from_array(fixed, t.name))
            changed.add(produced)
    if not changed:
        return source, 0, []
    consumers: list[str] = []
    tainted = set(changed)  # the constant, what adds it, and what reads that sum (a Softmax)
    for hop in range(2):
        reached = set()
        for i, node in enumerate(model.graph.node):
            if tainted & set(node.input) and node.name not in consumers:
                node.name = node.name or f"clamped_consumer_{i}"
                consumers.append(node.name)
                reached |= set(node.output)
        tainted = reached if hop == 0 else tainted
    onnx.save(model, str(out))
    if check and not _agree(source, out, check[:2]):
        out.unlink(missing_ok=True)
        return source, 0, []
    return out, len(changed), consumers


def _agree(a: Path, b: Path, feeds: list[Feeds]) -> bool:
    import onnxruntime as ort

    sa = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(str(b), providers=["CPUExecutionProvider"])
    for f in feeds:
        for x, y in zip(sa.run(None, f), sb.run(None, f), strict=True):
            if x.shape != y.shape or not np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
                return False
    return True
