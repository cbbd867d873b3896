"""The WebGPU part of a browser bundle (``milliserve edge build --webgpu``).

onnxruntime-web's WebGPU runtime is shipped beside the WASM one; the page imports it only
when it gets a WebGPU adapter, so a browser without one downloads nothing more. Two flavours
(both run the WASM provider too, both matched ONNX Runtime within float rounding):

- ``jspi`` (default): 16.8 MB, the smaller and the faster to create a session; it needs
  JSPI (``WebAssembly.Suspending``: Chrome and Edge 137+). A browser without JSPI runs WASM
  and says so.
- ``asyncify``: 26.8 MB, for WebGPU browsers without JSPI (Safari, older Chromium).

``--fp16`` adds a half-precision copy of an FP32 model, which only a page whose adapter has
``shader-f16`` downloads; the page times it against the others and keeps it only when it is
the fastest.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from milliserve.errors import ConfigError

__all__ = [
    "FLAVOURS",
    "PROVIDERS",
    "check_webgpu_options",
    "half_model",
    "unused_runtime_files",
    "webgpu_spec",
]

FLAVOURS = ("jspi", "asyncify")
PROVIDERS = ("auto", "wasm", "webgpu")
HALF_SAMPLE_LENGTH = 16  # a dynamic dim in the FP16 check's sample input


def check_webgpu_options(webgpu: str | None, provider: str, fp16: bool) -> None:
    if webgpu is not None and webgpu not in FLAVOURS:
        raise ConfigError(f"--webgpu {webgpu}: one of {', '.join(FLAVOURS)}")
    if provider not in PROVIDERS:
        raise ConfigError(f"--provider {provider}: one of {', '.join(PROVIDERS)}")
    if provider == "webgpu" and webgpu is None:
        raise ConfigError("--provider webgpu needs the WebGPU runtime in the bundle: add --webgpu")
    if fp16 and webgpu is None:
        raise ConfigError("--fp16 ships a copy for WebGPU adapters with shader-f16: add --webgpu")


def unused_runtime_files(versions: dict[str, Any], webgpu: str | None) -> set[str]:
    """The ORT files of the WebGPU flavours this bundle does not ship."""
    drop: set[str] = set()
    for name, flavour in versions["webgpu_flavours"].items():
        if name != webgpu:
            drop |= {flavour["entry"], f"{flavour['runtime']}.mjs", f"{flavour['runtime']}.wasm"}
    return drop


def webgpu_spec(
    versions: dict[str, Any], webgpu: str, staging: Path, half: dict[str, Any] | None
) -> dict[str, Any]:
    flavour = versions["webgpu_flavours"][webgpu]
    ort_dir = staging / versions["ort_dir"]
    files = (flavour["entry"], f"{flavour['runtime']}.mjs", f"{flavour['runtime']}.wasm")
    return {
        "flavour": webgpu,
        "needs": flavour["needs"],
        "entry": f"{versions['ort_dir']}/{flavour['entry']}",
        "runtime_bytes": sum((ort_dir / f).stat().st_size for f in files),
        "half_model": half,
    }


def _sample(path: Path) -> dict[str, Any]:
    """A fixed input for every model input: token ids 1..n, masks of ones, seeded floats."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    for i in session.get_inputs():
        shape = [
            d if isinstance(d, int) and d > 0 else (1 if n == 0 else HALF_SAMPLE_LENGTH)
            for n, d in enumerate(i.shape)
        ]
        if "int" in i.type:
            ids = np.arange(1, math.prod(shape) + 1).reshape(shape)
            values = np.ones(shape) if "mask" in i.name else ids
            feeds[i.name] = values.astype(np.int64 if "int64" in i.type else np.int32)
        else:
            feeds[i.name] = rng.normal(size=shape).astype(np.float64 if "double" in i.type else np.float32)
    return feeds


def half_model(source: Path, staging: Path, precision: str) -> dict[str, Any]:
    """Writes an FP16 copy of the FP32 ``source`` (inputs and outputs stay FP32) into the
    bundle, checked against it on a fixed sample with ONNX Runtime."""
    if precision != "fp32":
        raise ConfigError(
            f"--fp16 converts an FP32 model and {source} is {precision}: ship the FP32 model "
            "(--model-file) to add an FP16 copy"
        )
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    half = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    data = half.SerializeToString()
    name = f"model_half.{hashlib.sha256(data).hexdigest()[:12]}.onnx"
    feeds = _sample(source)
    full = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    try:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as exc:  # e.g. a graph with ONNX Runtime's own fused ops, saved offline
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{source}: its FP16 copy, made by ONNX Runtime's float16 converter, does not load "
            f"({reason}); a graph saved after ONNX Runtime's offline optimisations (optimize's "
            "ort_optimized) is one it cannot convert: add --fp16 to the model before those "
            "(--model-file), or drop --fp16"
        ) from None
    halved = session.run(None, feeds)
    diff = max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(full, halved, strict=True)
    )
    if not math.isfinite(diff):
        raise ConfigError(f"{source}: its FP16 copy gives non-finite outputs (values beyond FP16's range)")
    (staging / name).write_bytes(data)
    return {
        "file": name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "precision": "fp16",
        "max_abs_diff": diff,
    }
