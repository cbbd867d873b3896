"""The ASGI types and headers the HTTP routes share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["CANCEL_ON_DISCONNECT", "CLIENT_GONE", "JSON_HEADER", "Message", "Receive", "Scope", "Send"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADER = (b"content-type", b"application/json")

# A route that sets scope[CANCEL_ON_DISCONNECT] has its task cancelled with the message
# CLIENT_GONE when its client disconnects before the answer (server/http/connection.py): a
# queued tensor request leaves the queue and is never computed.
CANCEL_ON_DISCONNECT = "milliserve.cancel_on_disconnect"
CLIENT_GONE = "client disconnected"
