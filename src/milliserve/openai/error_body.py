"""OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, which every
``/v1`` route answers a failure with."""

from __future__ import annotations

from typing import Any

__all__ = ["openai_error"]


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body for an HTTP ``status``."""
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        503: "service_unavailable",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = {404: "model_not_found", 429: "rate_limit_exceeded"}.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
