"""ONNX Runtime backend.

Config ``parameters`` understood here (all values are strings, as in Triton):

============================  =========================================================
``intra_op_thread_count``     threads inside one operator (default: cores / instances)
``inter_op_thread_count``     threads across operators (default 1)
``graph_optimization_level``  ``disable``, ``basic``, ``extended`` or ``all`` (default)
``execution_providers``       comma list of ``cpu``, ``cuda``, ``tensorrt``, ``openvino``
``allow_spinning``            ``0``/``1``: let idle ORT threads spin (default 0: under
                              contention on small machines spinning inflates p99)
============================  =========================================================

The runtime's own parameters (``allow_nonfinite_inputs``, ``inline_execution``,
see docs/configuration.md) are accepted too. A provider that is requested but
not built into the installed onnxruntime is skipped with a warning in the log,
and the model runs on the providers that remain, CPU last.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.backends.base import BackendInfo
from milliserve.backends.registry import Instance
from milliserve.config.model_config import RUNTIME_PARAMETERS, ModelConfig
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.protocol.datatypes import BYTES
from milliserve.protocol.types import TensorSpec

__all__ = [
    "FACTORY",
    "OnnxRuntimeBackend",
    "OnnxRuntimeFactory",
    "OrtOptions",
    "parse_ort_options",
    "tensor_spec",
]

log = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": BYTES,
    "tensor(bfloat16)": "BF16",
}
_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
}
_GPU_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})
_LEVELS = ("disable", "basic", "extended", "all")
KNOWN_PARAMETERS = frozenset(
    {
        "intra_op_thread_count",
        "inter_op_thread_count",
        "graph_optimization_level",
        "execution_providers",
        "allow_spinning",
    }
)


@dataclass(frozen=True, slots=True)
class OrtOptions:
    intra_op_threads: int
    inter_op_threads: int
    graph_optimization_level: str
    providers: tuple[str, ...]
    allow_spinning: bool


def _int_param(params: dict[str, str], key: str, default: int) -> int:
    raw = params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"parameter {key!r} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"parameter {key!r} must be >= 0, got {value}")
    return value


def parse_ort_options(config: ModelConfig) -> OrtOptions:
    """Read ONNX Runtime options from a model config. Raises ConfigError naming the parameter."""
    params = config.parameters
    unknown = sorted(set(params) - KNOWN_PARAMETERS - RUNTIME_PARAMETERS)
    if unknown:
        known = sorted(KNOWN_PARAMETERS | RUNTIME_PARAMETERS)
        raise ConfigError(f"unknown parameters {unknown}; the onnxruntime backend knows {known}")
    cores = os.cpu_count() or 1
    intra = _int_param(params, "intra_op_thread_count", max(1, cores // config.instance_count))
    inter = _int_param(params, "inter_op_thread_count", 1)
    level = params.get("graph_optimization_level", "all").lower()
    if level not in _LEVELS:
        raise ConfigError(f"parameter 'graph_optimization_level' must be one of {_LEVELS}, got {level!r}")
    names = [p.strip().lower() for p in params.get("execution_providers", "").split(",") if p.strip()]
    bad = [n for n in names if n not in _PROVIDERS]
    if bad:
        raise ConfigError(
            f"parameter 'execution_providers': unknown {bad}; expected some of {sorted(_PROVIDERS)}"
        )
    if "cpu" not in names:
        names.append("cpu")
    spin = params.get("allow_spinning", "0").lower()
    if spin not in ("0", "1", "true", "false"):
        raise ConfigError(f"parameter 'allow_spinning' must be 0 or 1, got {spin!r}")
    return OrtOptions(
        intra_op_threads=intra,
        inter_op_threads=inter,
        graph_optimization_level=level,
        providers=tuple(_PROVIDERS[n] for n in names),
        allow_spinning=spin in ("1", "true"),
    )


def tensor_spec(node: Any) -> TensorSpec:
    datatype = _ORT_TYPES.get(node.type)
    if datatype is None:
        raise BackendError(f"tensor {node.name!r} has type {node.type}, which milliserve cannot serve")
    dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in node.shape)
    return TensorSpec(node.name, datatype, dims)


_NODE_FAILURE = "Non-zero status code returned while running"


def _status_message(exc: Exception) -> str:
    """ORT's message without its source-file prefix: 'running Add node add_6: Attempting to
    broadcast an axis by a dimension other than 1. 512 by 600'."""
    text = str(exc)
    head, _, status = text.partition("Status Message:")
    if not status:
        return text
    node = head.split(_NODE_FAILURE, 1)[-1].replace(". Name:''", "").strip(" .")
    detail = status.strip()
    if " was false. " in detail:  # drop the C++ assertion that precedes the explanation
        detail = detail.split(" was false. ", 1)[1]
    return f"{node}: {detail}" if node else detail


class OnnxRuntimeBackend:
    """One ONNX Runtime session (one model instance)."""

    def __init__(self, model_path: Path, options: OrtOptions, instance: Instance | None = None) -> None:
        import onnxruntime as ort

        available = set(ort.get_available_providers())
        notes: list[str] = []
        providers: list[Any] = []
        wanted = list(options.providers)
        gpu = instance is not None and instance.kind == "KIND_GPU"
        if gpu and _PROVIDERS["cuda"] not in wanted:
            wanted.insert(0, _PROVIDERS["cuda"])
        for p in wanted:
            if p in available:
                if gpu and p in _GPU_PROVIDERS:
                    providers.append((p, {"device_id": str(instance.device if instance else 0)}))
                else:
                    providers.append(p)
            elif gpu and p == _PROVIDERS["cuda"]:
                raise BackendError(
                    f"{model_path}: instance {instance.name if instance else ''!r} is KIND_GPU but this "
                    f"onnxruntime build has no CUDAExecutionProvider (available: {sorted(available)})"
                )
            else:
                notes.append(
                    f"execution provider {p} was requested but this onnxruntime build lacks it "
                    f"(available: {sorted(available)}); running without it"
                )
        for note in notes:
            log.warning("%s: %s", model_path, note)
        so = ort.SessionOptions()
        so.intra_op_num_threads = options.intra_op_threads
        so.inter_op_num_threads = options.inter_op_threads
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[options.graph_optimization_level]
        spin = "1" if options.allow_spinning else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", spin)
        so.add_session_config_entry("session.inter_op.allow_spinning", spin)
        so.log_severity_level = 4  # errors reach the client and our log; ORT need not print them too
        try:
            self._session = ort.InferenceSession(str(model_path), so, providers=providers)
        except Exception as exc:  # ORT raises its own exception types; report them uniformly
            raise BackendError(f"onnxruntime could not load {model_path}: {exc}") from exc
        self._info = BackendInfo(
            inputs=tuple(tensor_spec(i) for i in self._session.get_inputs()),
            outputs=tuple(tensor_spec(o) for o in self._session.get_outputs()),
            platform="onnxruntime_onnx",
            notes=tuple(notes),
        )
        from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

        self._invalid_argument = InvalidArgument
        self._fail = Fail
        # On the CPU provider alone, the session's C++ run without its Python wrapper, whose
        # checks (feed names, OrtValue ownership, graph capture, GPU fallback) repeat what
        # validation did or cannot apply: ~3 µs of a fraud_mlp request's ~10 µs run.
        raw = getattr(self._session, "_sess", None)
        cpu_only = self._session.get_providers() == ["CPUExecutionProvider"]
        self._run = raw.run if raw is not None and cpu_only else self._session.run
        self._string_inputs = {s.name for s in self._info.inputs if s.datatype == BYTES}

    def info(self) -> BackendInfo:
        return self._info

    def run(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        feeds = inputs
        if self._string_inputs:  # ORT wants str elements, the protocol carries bytes
            feeds = dict(inputs)
            for name in self._string_inputs:
                feeds[name] = np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(
                    inputs[name]
                )
        try:
            results = self._run(outputs, feeds, None)
        except self._invalid_argument as exc:
            # ORT's INVALID_ARGUMENT comes from the data (e.g. a token id past the vocabulary):
            # the client's fault, so a 400 that names it, not a 500.
            raise InvalidInputError(f"the model rejected the input data: {_status_message(exc)}") from exc
        except self._fail as exc:
            # A node that fails on shapes the config allows (a sequence longer than the position
            # table, two inputs of different lengths that the graph adds): the model loaded and
            # ran its warmup, so this input is what it cannot take. Allocation failures are not.
            text = str(exc)
            if _NODE_FAILURE in text and "alloc" not in text.lower():
                raise InvalidInputError(
                    f"the model cannot run on this input: {_status_message(exc)}"
                ) from exc
            raise BackendError(f"onnxruntime failed: {exc}") from exc
        except Exception as exc:
            raise BackendError(f"onnxruntime failed: {exc}") from exc
        return dict(zip(outputs, results, strict=True))

    def close(self) -> None:
        del self._session


class OnnxRuntimeFactory:
    """The ``onnxruntime`` backend (platform ``onnxruntime_onnx``, ``model.onnx``)."""

    name = "onnxruntime"
    platforms = ("onnxruntime_onnx",)
    model_filename = "model.onnx"

    def options(self, config: ModelConfig) -> OrtOptions:
        return parse_ort_options(config)

    def threads(self, options: OrtOptions) -> int:
        return options.intra_op_threads

    def gpu_available(self) -> bool:
        import onnxruntime as ort

        return _PROVIDERS["cuda"] in ort.get_available_providers()

    def create(self, model_path: Path, options: OrtOptions, instance: Instance) -> OnnxRuntimeBackend:
        return OnnxRuntimeBackend(model_path, options, instance)


FACTORY = OnnxRuntimeFactory()
