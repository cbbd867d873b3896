"""``/v2/systemsharedmemory/...`` and ``/v2/cudasharedmemory/...``: Triton's shared-memory
extension over HTTP (docs/protocol/extension_shared_memory.md).

    GET  v2/{kind}[/region/{name}]/status
    POST v2/{kind}/region/{name}/register      {"key", "offset", "byte_size"} (system)
    POST v2/{kind}[/region/{name}]/unregister
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from milliserve.errors import MalformedRequestError, NotFoundError
from milliserve.protocol.json_codec import decode_json_object, encode_json
from milliserve.server.http.asgi import JSON_HEADER, Receive, Scope
from milliserve.server.shm.service import SharedMemoryService

__all__ = ["KINDS", "SharedMemoryRoutes"]

KINDS = ("systemsharedmemory", "cudasharedmemory")
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
ReadBody = Callable[[Scope, Receive], Awaitable[bytes]]


class SharedMemoryRoutes:
    def __init__(self, service: SharedMemoryService, read_body: ReadBody) -> None:
        self.service = service
        self._read_body = read_body

    async def __call__(self, scope: Scope, receive: Receive, rest: list[str]) -> Answer:
        """``rest``: the path after ``v2``, starting with one of KINDS."""
        method: str = scope["method"]
        kind, tail = rest[0], rest[1:]
        name = ""
        if len(tail) == 3 and tail[0] == "region":
            name, tail = tail[1], tail[2:]
        client = scope.get("client")
        peer = client[0] if client else None
        svc = self.service
        system = kind == "systemsharedmemory"
        if method == "GET" and tail == ["status"]:
            rows = svc.system_status(name, peer) if system else svc.cuda_status(name, peer)
            return 200, encode_json(rows), [JSON_HEADER]
        if method == "POST" and tail == ["unregister"]:
            await self._read_body(scope, receive)
            (svc.system_unregister if system else svc.cuda_unregister)(name, peer)
            return 200, b"{}", [JSON_HEADER]
        if method == "POST" and tail == ["register"] and name:
            body = await self._read_body(scope, receive)
            doc: dict[str, Any] = decode_json_object(body) if body.strip() else {}
            if system:
                if "key" not in doc or "byte_size" not in doc:
                    raise MalformedRequestError("a register request needs 'key' and 'byte_size'")
                svc.system_register(name, doc["key"], doc.get("offset", 0), doc["byte_size"], peer)
            else:
                svc.cuda_register(name, peer)
            return 200, b"{}", [JSON_HEADER]
        raise NotFoundError(f"no route for {method} /v2/{'/'.join(rest)}")
