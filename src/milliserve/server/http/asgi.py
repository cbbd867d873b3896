"""The ASGI types and headers the HTTP routes share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["JSON_HEADER", "Message", "Receive", "Scope", "Send"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADER = (b"content-type", b"application/json")
