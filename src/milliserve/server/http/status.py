"""Map milliserve errors to HTTP status codes (the only place that knows both)."""

from __future__ import annotations

from milliserve.errors import (
    BackendError,
    DeadlineUnmeetableError,
    ModelControlDisabledError,
    NotFoundError,
    QueueTimeoutError,
    RequestError,
    RequestTooLargeError,
    UnavailableError,
)

__all__ = ["http_status"]


def http_status(exc: BaseException) -> int:
    """The HTTP status for an exception raised by the dataplane."""
    if isinstance(exc, RequestTooLargeError):
        return 413
    if isinstance(exc, RequestError):
        return 400
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, UnavailableError):
        return 503
    if isinstance(exc, QueueTimeoutError):
        return 504
    if isinstance(exc, DeadlineUnmeetableError):
        return 429
    if isinstance(exc, ModelControlDisabledError):
        return 403
    if isinstance(exc, BackendError):
        return 500
    return 500
