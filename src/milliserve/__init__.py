"""milliserve: a real-time ML inference server.

Triton-style model repository, ONNX Runtime, work-conserving dynamic batching,
and the Open Inference Protocol over HTTP and gRPC. Importing this package has
no side effects: no logging setup, no metric registration. Its names load lazily
(PEP 562): ``import milliserve`` imports neither the server nor ONNX Runtime until
a name that needs them is used.
"""

from __future__ import annotations

import typing as _typing
from importlib import import_module as _import_module

from milliserve._version import __version__

if _typing.TYPE_CHECKING:
    from milliserve.config.model_config import ModelConfig, load_model_config
    from milliserve.config.settings import Settings
    from milliserve.errors import (
        BackendError,
        ConfigError,
        InvalidInputError,
        MalformedRequestError,
        MilliserveError,
        ModelControlDisabledError,
        ModelNotReadyError,
        NotFoundError,
        QueueFullError,
        QueueTimeoutError,
        RequestError,
        RequestTooLargeError,
        ServerShuttingDownError,
        UnavailableError,
    )
    from milliserve.examples.build import build_examples
    from milliserve.protocol.types import InferRequest, InferResponse, InferTensor, RequestedOutput
    from milliserve.server.assembly import Server, serve

__all__ = [
    "BackendError",
    "ConfigError",
    "InferRequest",
    "InferResponse",
    "InferTensor",
    "InvalidInputError",
    "MalformedRequestError",
    "MilliserveError",
    "ModelConfig",
    "ModelControlDisabledError",
    "ModelNotReadyError",
    "NotFoundError",
    "QueueFullError",
    "QueueTimeoutError",
    "RequestError",
    "RequestTooLargeError",
    "RequestedOutput",
    "Server",
    "ServerShuttingDownError",
    "Settings",
    "UnavailableError",
    "__version__",
    "build_examples",
    "load_model_config",
    "serve",
]

# each public name, and the module it is defined in
_WHERE = {
    "ModelConfig": "milliserve.config.model_config",
    "load_model_config": "milliserve.config.model_config",
    "Settings": "milliserve.config.settings",
    **dict.fromkeys(
        (
            "BackendError",
            "ConfigError",
            "InvalidInputError",
            "MalformedRequestError",
            "MilliserveError",
            "ModelControlDisabledError",
            "ModelNotReadyError",
            "NotFoundError",
            "QueueFullError",
            "QueueTimeoutError",
            "RequestError",
            "RequestTooLargeError",
            "ServerShuttingDownError",
            "UnavailableError",
        ),
        "milliserve.errors",
    ),
    "build_examples": "milliserve.examples.build",
    **dict.fromkeys(
        ("InferRequest", "InferResponse", "InferTensor", "RequestedOutput"), "milliserve.protocol.types"
    ),
    "Server": "milliserve.server.assembly",
    "serve": "milliserve.server.assembly",
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'milliserve' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
