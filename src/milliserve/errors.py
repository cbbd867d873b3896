"""The one exception hierarchy of milliserve.

Core code raises these; ``milliserve.status`` holds the one table that maps them to
HTTP statuses, gRPC codes and failure reasons. Messages name the offending value
and what was expected.

    MilliserveError
    ├── ConfigError                  a model or server configuration is wrong
    ├── RequestError                 the request is at fault (HTTP 400 / INVALID_ARGUMENT)
    │   ├── MalformedRequestError    the body cannot be decoded (bad JSON, truncated binary, ...)
    │   ├── InvalidInputError        decodable, but does not match the model (name, datatype, shape)
    │   ├── RequestTooLargeError     the body is over the size limit (HTTP 413)
    │   ├── UnsupportedEncodingError a Content-Encoding the server does not take (HTTP 415)
    │   └── UnauthorizedError        no valid token with a server that requires one (HTTP 401)
    ├── NotFoundError                unknown model or version (HTTP 404 / NOT_FOUND)
    ├── UnavailableError             cannot serve now (HTTP 503 / UNAVAILABLE)
    │   ├── ModelNotReadyError       the model is loading, unloading or failed to load
    │   ├── QueueFullError           the batcher queue is at max_queue_size
    │   └── ServerShuttingDownError  the server no longer accepts work
    ├── QueueTimeoutError            the request expired in the queue (HTTP 504 / DEADLINE_EXCEEDED)
    ├── DeadlineUnmeetableError      the request cannot finish before its deadline, so it is not run
    │                                (HTTP 429 / DEADLINE_EXCEEDED)
    ├── OverBudgetError              a generation's first token cannot come within the model's
    │                                budget (ttft_ms) given the queue (HTTP 429 / RESOURCE_EXHAUSTED)
    ├── ModelControlDisabledError    the repository API is off (HTTP 403 / PERMISSION_DENIED)
    ├── ForbiddenError               a feature that is off, or a peer that may not use it
    │                                (shared memory; HTTP 403 / PERMISSION_DENIED)
    ├── NotSupportedError            a Triton feature milliserve does not have, such as CUDA
    │                                shared memory (HTTP 501 / UNIMPLEMENTED)
    ├── MissingDependencyError       an optional package a command needs is not installed
    └── BackendError                 the backend failed while loading or running (HTTP 500 / INTERNAL)
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "ConfigError",
    "DeadlineUnmeetableError",
    "ForbiddenError",
    "InvalidInputError",
    "MalformedRequestError",
    "MilliserveError",
    "MissingDependencyError",
    "ModelControlDisabledError",
    "ModelNotReadyError",
    "NotFoundError",
    "NotSupportedError",
    "OverBudgetError",
    "QueueFullError",
    "QueueTimeoutError",
    "RequestError",
    "RequestTooLargeError",
    "ServerShuttingDownError",
    "UnauthorizedError",
    "UnavailableError",
    "UnsupportedEncodingError",
    "shown",
]


class MilliserveError(Exception):
    """Base class of every error milliserve raises on purpose."""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class ConfigError(MilliserveError):
    """A configuration file or value is invalid. The message names the file and field."""


class RequestError(MilliserveError):
    """The client sent something the server cannot accept."""


class MalformedRequestError(RequestError):
    """The request body could not be decoded."""


class InvalidInputError(RequestError):
    """The request decodes but does not match the model's inputs."""


class RequestTooLargeError(RequestError):
    """The request body is larger than the configured limit."""


class UnsupportedEncodingError(RequestError):
    """The request body is compressed in a way the server does not decode."""


class UnauthorizedError(RequestError):
    """The server requires a token (``--auth-token``) and the request has none that matches."""


class NotFoundError(MilliserveError):
    """An unknown model or version was named."""


class UnavailableError(MilliserveError):
    """The server cannot take this request now; retrying later may succeed."""


class ModelNotReadyError(UnavailableError):
    """The model exists but is not ready (loading, unloading or failed)."""


class QueueFullError(UnavailableError):
    """The model's queue is full (max_queue_size); the request was rejected at once."""


class ServerShuttingDownError(UnavailableError):
    """The server is draining and accepts no new work."""


class QueueTimeoutError(MilliserveError):
    """The request's timeout expired while it waited in the queue."""


class DeadlineUnmeetableError(MilliserveError):
    """The request would miss its deadline (or already has): rejected without running it."""


class ModelControlDisabledError(MilliserveError):
    """The repository (load/unload) API is disabled in this server."""


class ForbiddenError(MilliserveError):
    """The server does not allow this: a feature that is off (shared memory without
    ``--shared-memory system``), or a peer that may not use it (shared memory from a
    non-loopback address)."""


class NotSupportedError(MilliserveError):
    """A Triton feature that milliserve does not have (CUDA shared memory)."""


class MissingDependencyError(MilliserveError):
    """An optional package (an extra) that a command needs is not installed; the message
    says what to install."""


class BackendError(MilliserveError):
    """The backend failed to load a model or to run a batch."""


class OverBudgetError(MilliserveError):
    """Admission refused: the estimated time to first token is over the model's budget."""


def shown(value: str, limit: int = 128) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters: an error that
    echoed a 100 KB name whole would not fit a client's header limit (gRPC status)."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + f"… ({len(value)} characters)"
