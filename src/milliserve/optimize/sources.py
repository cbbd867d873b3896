"""Where a model comes from: an ONNX file, a PyTorch factory (``package.module:factory``
returning an ``nn.Module`` and an example input) or a saved TorchScript file. PyTorch
models are exported to ONNX here (opset 17, dynamic batch axis, and a dynamic sequence
axis for 2-D integer inputs) and the export is checked against PyTorch's own outputs.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.errors import ConfigError, MilliserveError

__all__ = [
    "ExportError",
    "Source",
    "TorchModel",
    "export_onnx",
    "load_module_factory",
    "load_source",
    "torch_outputs",
    "with_example",
]

log = logging.getLogger(__name__)
OPSET = 17
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")


class ExportError(MilliserveError):
    """The PyTorch model could not be exported to ONNX, or the export disagrees with PyTorch."""


@dataclass
class TorchModel:
    """A PyTorch model and the example input it was described with."""

    module: Any  # torch.nn.Module or torch.jit.ScriptModule
    example: dict[str, Any]  # input name -> tensor
    output_names: list[str] = field(default_factory=list)

    @property
    def input_names(self) -> list[str]:
        return list(self.example)


@dataclass
class Source:
    spec: str
    onnx: Path | None = None  # an ONNX source as given
    torch: TorchModel | None = None


def _as_named(example: Any) -> dict[str, Any]:
    import torch

    if isinstance(example, torch.Tensor):
        return {"input": example}
    if isinstance(example, dict):
        return dict(example)
    if isinstance(example, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in example):
        return {f"input_{i}": t for i, t in enumerate(example)}
    raise ConfigError("the example input must be a tensor, a tuple of tensors or a dict of name -> tensor")


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "PyTorch sources need torch: pip install 'milliserve[torch]' (pins torch==2.13.0)"
        ) from None
    return torch


def load_source(spec: str | Path) -> Source:
    """Resolve SOURCE. Raises ConfigError naming what is wrong with it."""
    text = str(spec)
    path = Path(text)
    if path.suffix == ".onnx":
        if not path.is_file():
            raise ConfigError(f"{path}: no such ONNX file")
        return Source(text, onnx=path)
    if path.suffix in TORCHSCRIPT_SUFFIXES:
        if not path.is_file():
            raise ConfigError(f"{path}: no such TorchScript file")
        torch = _import_torch()
        # TorchScript archives are code plus tensors: load only files you trust, as with any model.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TorchScript is deprecated in torch 2.13, still loads
                module = torch.jit.load(str(path), map_location="cpu")
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"{path}: not a TorchScript file saved with torch.jit.save ({exc})") from None
        # no example travels with the file: with_example() takes the first EVAL rows
        return Source(text, torch=TorchModel(module.eval(), {}))
    if ":" in text and not path.exists():
        mod_name, _, attr = text.partition(":")
        torch = _import_torch()
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{text}: cannot import the factory ({exc})") from None
        made = factory()
        if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
            raise ConfigError(f"{text}: the factory must return (nn.Module, example input)")
        return Source(text, torch=TorchModel(made[0].eval(), _as_named(made[1])))
    raise ConfigError(
        f"{text}: give an .onnx file, a TorchScript file ({', '.join(TORCHSCRIPT_SUFFIXES)}) "
        "or a PyTorch factory as package.module:function"
    )


def load_module_factory(spec: str) -> Any:
    """Import ``package.module:function`` and call it for an ``nn.Module`` (a student architecture)."""
    torch = _import_torch()
    mod_name, _, attr = spec.partition(":")
    try:
        made = getattr(importlib.import_module(mod_name), attr)()
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{spec}: cannot import the factory ({exc})") from None
    if isinstance(made, tuple):
        made = made[0]
    if not isinstance(made, torch.nn.Module):
        raise ConfigError(f"{spec}: the factory must return an nn.Module")
    return made


def with_example(model: TorchModel, inputs: dict[str, np.ndarray[Any, Any]]) -> TorchModel:
    """Give a model without an example (a TorchScript file) the first two rows of ``inputs``."""
    import torch

    if not model.example:
        model.example = {k: torch.from_numpy(np.ascontiguousarray(v[:2])) for k, v in inputs.items()}
    return model


def torch_outputs(model: TorchModel, feeds: dict[str, np.ndarray[Any, Any]] | None = None) -> list[Any]:
    """Run the PyTorch model (on ``feeds``, or its example) and return its outputs as numpy arrays."""
    import torch

    inputs = (
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
        if feeds is not None
        else model.example
    )
    with torch.inference_mode():
        out = model.module(*inputs.values())
    if isinstance(out, torch.Tensor):
        out = (out,)
    elif isinstance(out, dict):
        out = tuple(out.values())
    return [o.detach().numpy() for o in out]


def _eager_attention(module: Any) -> list[tuple[Any, str]]:
    """Switch transformers models inside ``module`` to eager attention for the export, and
    return what to restore. SDPA exports as a pattern ONNX Runtime's BERT fusion does not
    recognise; eager attention fuses into one Attention op per layer."""
    switched = []
    for sub in module.modules() if hasattr(module, "modules") else ():
        config = getattr(sub, "config", None)
        current = getattr(config, "_attn_implementation", None)
        if current in (None, "eager") or not hasattr(sub, "set_attn_implementation"):
            continue
        try:
            sub.set_attn_implementation("eager")
        except (ValueError, ImportError, AttributeError):
            continue
        switched.append((sub, current))
    return switched


def export_onnx(model: TorchModel, out: Path, rtol: float = 1e-3, atol: float = 1e-4) -> Path:
    """Export to ONNX (opset 17, dynamic batch and sequence axes), then check that ONNX
    Runtime gives PyTorch's outputs on the example. Raises ExportError naming the cause."""
    import onnxruntime as ort
    import torch

    reference = torch_outputs(model)
    outputs = model.output_names or (
        ["output"] if len(reference) == 1 else [f"output_{i}" for i in range(len(reference))]
    )
    model.output_names = outputs
    axes: dict[str, dict[int, str]] = {}
    for name, t in model.example.items():
        axes[name] = {0: "batch"}
        if t.dim() == 2 and not t.is_floating_point():  # token ids, masks: [batch, sequence]
            axes[name][1] = "sequence"
    for name in outputs:
        axes[name] = {0: "batch"}
    out.parent.mkdir(parents=True, exist_ok=True)
    switched = _eager_attention(model.module)
    if switched:
        log.info("exporting with eager attention (was %s) so that ONNX Runtime can fuse it", switched[0][1])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript-based exporter warns it is legacy
            torch.onnx.export(
                model.module,
                tuple(model.example.values()),
                str(out),
                input_names=model.input_names,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
                do_constant_folding=True,
            )
    except Exception as exc:  # torch raises many types; the message names the operator
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        kind = (
            "unsupported operator" if "Unsupported" in str(exc) or "not supported" in str(exc) else "failed"
        )
        raise ExportError(f"ONNX export {kind}: {text}") from exc
    finally:
        for sub, previous in switched:
            sub.set_attn_implementation(previous)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in model.example.items()})
    for name, ref, arr in zip(outputs, reference, got, strict=True):
        if ref.shape != arr.shape or not np.allclose(arr, ref, rtol=rtol, atol=atol):
            diff = float(np.max(np.abs(arr - ref))) if ref.shape == arr.shape else float("nan")
            raise ExportError(
                f"ONNX export of output {name!r} disagrees with PyTorch (max abs diff {diff:.3g}, "
                f"shapes {list(ref.shape)} vs {list(arr.shape)})"
            )
    log.info("exported %s to %s (opset %d), outputs match PyTorch", type(model.module).__name__, out, OPSET)
    return out
