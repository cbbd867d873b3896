"""The one error table: each exception class's HTTP status, gRPC code and failure reason.

HTTP, gRPC unary calls, gRPC streams and the statistics (Triton's failure reasons)
all look errors up here, along the class hierarchy, so a subclass inherits its
parent's row unless it has its own. Anything not in the table (a bug) is a 500 /
INTERNAL for that one request.

gRPC codes are written as names of ``grpc.StatusCode`` members, so this module (and
the runtime, which records failure reasons) never imports grpc; the gRPC front end
turns the name into the enum once per class.

This lives beside ``errors.py`` rather than in ``server/`` because the runtime's
statistics need the failure reason and must not import the server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from milliserve import errors as e

__all__ = ["INTERNAL", "ErrorStatus", "status_of"]


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    http: int
    grpc: str  # a grpc.StatusCode member name
    reason: str  # Triton's failure reason, a label of milliserve_inference_request_failure


INTERNAL = ErrorStatus(500, "INTERNAL", "BACKEND")

_TABLE: dict[type[BaseException], ErrorStatus] = {
    e.RequestError: ErrorStatus(400, "INVALID_ARGUMENT", "REJECTED"),
    e.RequestTooLargeError: ErrorStatus(413, "RESOURCE_EXHAUSTED", "REJECTED"),
    e.UnsupportedEncodingError: ErrorStatus(415, "UNIMPLEMENTED", "REJECTED"),
    e.UnauthorizedError: ErrorStatus(401, "UNAUTHENTICATED", "REJECTED"),
    e.NotFoundError: ErrorStatus(404, "NOT_FOUND", "REJECTED"),
    e.UnavailableError: ErrorStatus(503, "UNAVAILABLE", "UNAVAILABLE"),
    e.QueueFullError: ErrorStatus(503, "UNAVAILABLE", "QUEUE_FULL"),
    e.QueueTimeoutError: ErrorStatus(504, "DEADLINE_EXCEEDED", "TIMEOUT"),
    e.DeadlineUnmeetableError: ErrorStatus(429, "DEADLINE_EXCEEDED", "DEADLINE"),
    e.OverBudgetError: ErrorStatus(429, "RESOURCE_EXHAUSTED", "BUDGET"),
    e.ModelControlDisabledError: ErrorStatus(403, "PERMISSION_DENIED", "REJECTED"),
    e.ForbiddenError: ErrorStatus(403, "PERMISSION_DENIED", "REJECTED"),
    e.NotSupportedError: ErrorStatus(501, "UNIMPLEMENTED", "REJECTED"),
    e.BackendError: INTERNAL,
    asyncio.CancelledError: ErrorStatus(499, "CANCELLED", "CANCELED"),
}


_FOUND: dict[type[BaseException], ErrorStatus] = {}  # the lookups done so far, by class


def status_of(exc: BaseException) -> ErrorStatus:
    """The row for ``exc``'s class, or its nearest ancestor's; INTERNAL when none matches."""
    cls = type(exc)
    found = _FOUND.get(cls)
    if found is None:
        found = next((_TABLE[k] for k in cls.__mro__ if k in _TABLE), INTERNAL)
        _FOUND[cls] = found
    return found
