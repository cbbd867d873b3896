"""milliserve: a real-time ML inference server.

Triton-style model repository, ONNX Runtime, work-conserving dynamic batching,
and the Open Inference Protocol over HTTP and gRPC. Importing this package has
no side effects: no logging setup, no metric registration.
"""

from __future__ import annotations

from milliserve._version import __version__
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
from milliserve.server.app import Server, serve

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
