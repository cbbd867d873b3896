"""OpenVINO backend: a version folder holds ``model.xml`` and ``model.bin`` (OpenVINO IR), as
for Triton's ``platform: "openvino"`` / ``backend: "openvino"``.

Config ``parameters`` understood here (string values; the names are those of Triton's
openvino_backend, the values are case-insensitive):

=============================  ==============================================================
``INFERENCE_NUM_THREADS``      threads of one inference (default: cores / instances; 0:
                               OpenVINO decides)
``INFERENCE_PRECISION_HINT``   ``f32`` (default), ``bf16`` or ``f16``
``HINT_BF16``                  ``YES``: Triton's spelling of ``INFERENCE_PRECISION_HINT: bf16``
``PERFORMANCE_HINT``           ``LATENCY`` (default), ``THROUGHPUT`` or ``CUMULATIVE_THROUGHPUT``
``NUM_STREAMS``                ``AUTO``, ``NUMA`` or a number (default: the hint decides)
``SKIP_OV_DYNAMIC_BATCHSIZE``  ``YES``: keep a static batch dimension as the model has it
=============================  ==============================================================

The runtime's own parameters (``allow_nonfinite_inputs``, ``inline_execution``) are
accepted too. openvino is an optional dependency: ``pip install 'milliserve[openvino]'``.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from milliserve.backends.base import BackendInfo
from milliserve.backends.registry import Instance
from milliserve.config.model_config import RUNTIME_PARAMETERS, ModelConfig
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.protocol.types import TensorSpec

__all__ = ["FACTORY", "OpenVinoBackend", "OpenVinoFactory", "OvOptions", "parse_ov_options", "tensor_spec"]

INSTALL_HINT = "pip install 'milliserve[openvino]'"
# OpenVINO element type names -> OIP datatypes (string tensors are not served yet)
_OV_TYPES = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
    "bf16": "BF16",
}
_PRECISIONS = ("f32", "bf16", "f16")
_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
_YES_NO = ("YES", "NO")
KNOWN_PARAMETERS = frozenset(
    {
        "INFERENCE_NUM_THREADS",
        "INFERENCE_PRECISION_HINT",
        "HINT_BF16",
        "PERFORMANCE_HINT",
        "NUM_STREAMS",
        "SKIP_OV_DYNAMIC_BATCHSIZE",
    }
)


def _openvino(error: type[Exception]) -> ModuleType:
    try:
        return importlib.import_module("openvino")
    except ImportError as exc:
        raise error(f"the openvino backend needs the openvino package: {INSTALL_HINT} ({exc})") from None


@dataclass(frozen=True, slots=True)
class OvOptions:
    inference_threads: int  # 0: OpenVINO decides
    precision: str
    performance_hint: str
    num_streams: str | None  # "AUTO", "NUMA" or a number; None: the hint decides
    dynamic_batch: bool  # make a static first dimension dynamic (max_batch_size > 0)

    def properties(self, device: str) -> dict[str, str]:
        """Compile properties for ``device`` (the thread count is the CPU plugin's only)."""
        props = {"INFERENCE_PRECISION_HINT": self.precision, "PERFORMANCE_HINT": self.performance_hint}
        if self.num_streams is not None:
            props["NUM_STREAMS"] = self.num_streams
        if device == "CPU" and self.inference_threads:
            props["INFERENCE_NUM_THREADS"] = str(self.inference_threads)
        return props


def _choice(params: dict[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = params.get(key, default).strip().upper()
    if value not in (a.upper() for a in allowed):
        raise ConfigError(f"parameter {key!r} must be one of {list(allowed)}, got {params[key]!r}")
    return allowed[[a.upper() for a in allowed].index(value)]


def parse_ov_options(config: ModelConfig) -> OvOptions:
    """Read OpenVINO options from a model config. Raises ConfigError naming the parameter."""
    params = config.parameters
    unknown = sorted(set(params) - KNOWN_PARAMETERS - RUNTIME_PARAMETERS)
    if unknown:
        known = sorted(KNOWN_PARAMETERS | RUNTIME_PARAMETERS)
        raise ConfigError(f"unknown parameters {unknown}; the openvino backend knows {known}")
    cores = os.cpu_count() or 1
    raw = params.get("INFERENCE_NUM_THREADS")
    threads = max(1, cores // config.instance_count)
    if raw is not None:
        if not raw.strip().isdigit():
            raise ConfigError(
                f"parameter 'INFERENCE_NUM_THREADS' must be a number >= 0 (0: OpenVINO decides), got {raw!r}"
            )
        threads = int(raw)
    # Pinned to f32: on CPUs with bf16 (AVX512_BF16, AMX) OpenVINO otherwise picks bf16 by
    # itself, and a model answers differently from the same model under onnxruntime.
    precision = _choice(params, "INFERENCE_PRECISION_HINT", _PRECISIONS, "f32")
    if _choice(params, "HINT_BF16", _YES_NO, "NO") == "YES":
        if "INFERENCE_PRECISION_HINT" in params and precision != "bf16":
            raise ConfigError(
                f"parameters 'HINT_BF16' YES and 'INFERENCE_PRECISION_HINT' {precision!r} disagree; "
                "give one of them"
            )
        precision = "bf16"
    # One infer request per instance runs one call at a time, so streams that THROUGHPUT
    # would add sit idle: parallelism comes from instance_group's count.
    hint = _choice(params, "PERFORMANCE_HINT", _HINTS, "LATENCY")
    streams = params.get("NUM_STREAMS")
    if streams is not None:
        streams = streams.strip().upper()
        if streams not in ("AUTO", "NUMA") and not (streams.isdigit() and int(streams) > 0):
            raise ConfigError(
                f"parameter 'NUM_STREAMS' must be one of ['AUTO', 'NUMA'] or a number > 0, "
                f"got {params['NUM_STREAMS']!r}"
            )
    skip = _choice(params, "SKIP_OV_DYNAMIC_BATCHSIZE", _YES_NO, "NO") == "YES"
    return OvOptions(threads, precision, hint, streams, config.max_batch_size > 0 and not skip)


def _port_name(port: Any) -> str:
    try:
        return str(port.any_name)
    except RuntimeError:  # a port without tensor names: its node's name stands in
        return str(port.get_node().get_friendly_name())


def tensor_spec(port: Any) -> TensorSpec:
    """A port as the protocol sees it: its ``any_name``, OIP datatype and dims (-1 dynamic)."""
    name = _port_name(port)
    element = port.get_element_type().get_type_name()
    datatype = _OV_TYPES.get(element)
    if datatype is None:
        raise BackendError(f"tensor {name!r} has type {element}, which milliserve cannot serve")
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        raise BackendError(f"tensor {name!r} has a dynamic rank, which milliserve cannot serve")
    return TensorSpec(name, datatype, tuple(d.get_length() if d.is_static else -1 for d in shape))


def make_batch_dynamic(model: Any, where: Path) -> None:
    """Reshape the static first dimension of each input to a dynamic one, so the batcher may
    send any batch size. Raises BackendError when the model cannot take it."""
    ov = _openvino(BackendError)
    shapes = {}
    for port in model.inputs:
        shape = port.get_partial_shape()
        if shape.rank.is_static and shape.rank.get_length() > 0 and shape[0].is_static:
            shapes[port] = ov.PartialShape([ov.Dimension(), *list(shape)[1:]])
    if not shapes:
        return
    try:
        model.reshape(shapes)
    except Exception as exc:  # OpenVINO raises RuntimeError, or its own types
        names = sorted(_port_name(p) for p in shapes)
        raise BackendError(
            f"{where}: cannot make the batch dimension of inputs {names} dynamic "
            f"({_message(exc)}); set max_batch_size: 0, or SKIP_OV_DYNAMIC_BATCHSIZE: YES "
            "with a model exported for max_batch_size"
        ) from exc


_CHECK = re.compile(r"Check '.*?' failed at \S+?:\d+:?")


def _message(exc: Exception) -> str:
    """OpenVINO's message without its source-file lines: "[CPU] Add node with name 's':
    Eltwise shape infer input shapes dim index: 1 mismatch"."""
    lines = (_CHECK.sub("", line).strip() for line in str(exc).splitlines())
    kept = [line for line in lines if line and not line.startswith("Exception from ")]
    return ": ".join(kept) or str(exc).strip()


def device_name(instance: Instance | None) -> str:
    """OpenVINO's device for an instance: ``CPU``, ``GPU`` (GPU 0) or ``GPU.<n>``."""
    if instance is None or instance.kind != "KIND_GPU":
        return "CPU"
    return "GPU" if instance.device <= 0 else f"GPU.{instance.device}"


class OpenVinoBackend:
    """One compiled model and its one infer request (one model instance)."""

    def __init__(self, model_path: Path, options: OvOptions, instance: Instance | None = None) -> None:
        ov = _openvino(BackendError)
        core = ov.Core()
        device = device_name(instance)
        try:
            model = core.read_model(str(model_path))
        except Exception as exc:
            raise BackendError(f"openvino could not read {model_path}: {_message(exc)}") from exc
        if options.dynamic_batch:
            make_batch_dynamic(model, model_path)
        try:
            self._compiled = core.compile_model(model, device, options.properties(device))
            self._request = self._compiled.create_infer_request()
        except Exception as exc:
            raise BackendError(
                f"openvino could not compile {model_path} for {device}: {_message(exc)}"
            ) from exc
        inputs = tuple(tensor_spec(p) for p in self._compiled.inputs)
        outputs = tuple(tensor_spec(p) for p in self._compiled.outputs)
        self._input_index = {s.name: i for i, s in enumerate(inputs)}
        self._output_index = {s.name: i for i, s in enumerate(outputs)}
        self._info = BackendInfo(inputs=inputs, outputs=outputs, platform="openvino")

    def info(self) -> BackendInfo:
        return self._info

    def run(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        feeds = {self._input_index[name]: array for name, array in inputs.items()}
        try:
            results = self._request.infer(feeds, share_inputs=True, share_outputs=True)
        except Exception as exc:  # OpenVINO raises RuntimeError for all of these
            message = _message(exc)
            lowered = message.lower()
            # A tensor whose shape the model cannot take (the input itself, or a node's shape
            # inference on it) is the client's: a 400 that names it. Allocation failures are not.
            if ("shape" in lowered or "incompatible" in lowered) and "alloc" not in lowered:
                raise InvalidInputError(f"the model cannot run on this input: {message}") from exc
            raise BackendError(f"openvino failed: {message}") from exc
        # share_outputs: OpenVINO reuses these buffers on the next call, so each requested
        # output is copied once here (and the ones not asked for are never copied).
        return {name: np.array(results[self._output_index[name]], copy=True) for name in outputs}

    def close(self) -> None:
        del self._request
        del self._compiled


class OpenVinoFactory:
    """The ``openvino`` backend (platform ``openvino``, ``model.xml`` + ``model.bin``)."""

    name = "openvino"
    platforms = ("openvino",)
    model_filename = "model.xml"

    def options(self, config: ModelConfig) -> OvOptions:
        _openvino(ConfigError)  # a missing package fails here, before any instance is made
        return parse_ov_options(config)

    def threads(self, options: OvOptions) -> int:
        return options.inference_threads or os.cpu_count() or 1

    def gpu_available(self) -> bool:
        devices = _openvino(BackendError).Core().available_devices  # "GPU", or "GPU.0", "GPU.1"...
        return any(d == "GPU" or d.startswith("GPU.") for d in devices)

    def create(self, model_path: Path, options: OvOptions, instance: Instance) -> OpenVinoBackend:
        return OpenVinoBackend(model_path, options, instance)


FACTORY = OpenVinoFactory()
