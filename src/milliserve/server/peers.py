"""The other workers of one ``milliserve serve --workers N``.

Each worker also listens on a private port on 127.0.0.1, where it answers for itself only.
A worker asked for ``/metrics`` or Triton's statistics on a public port asks its siblings
there and merges: metrics get a ``worker`` label (one endpoint, every worker's series),
statistics are summed (what Triton's clients expect of one server). A sibling that does not
answer in time (restarting, say) is left out and the merge says nothing of it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from milliserve.observability.merge import merge_metrics

__all__ = ["Peers"]

log = logging.getLogger(__name__)

_MAX_BODY = 64 << 20


async def _get(port: int, path: str, timeout_s: float, token: str | None = None) -> bytes:
    """GET ``path`` from 127.0.0.1:``port`` (our own server: HTTP/1.1, Content-Length)."""

    async def call() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            auth = f"authorization: Bearer {token}\r\n" if token else ""
            writer.write(
                f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}connection: close\r\n\r\n".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if length is None or length > _MAX_BODY:
                raise ValueError(f"worker on port {port}: no usable content-length")
            body = await reader.readexactly(length)
            if status != 200:
                raise ValueError(f"worker on port {port}: HTTP {status} for {path}")
            return body
        finally:
            writer.close()

    return await asyncio.wait_for(call(), timeout_s)


class Peers:
    """This worker's index and every worker's private port (this one's included); the
    server's token, when it has one, goes with every call."""

    def __init__(
        self, index: int, ports: list[int], token: str | None = None, timeout_s: float = 2.0
    ) -> None:
        self.index, self.ports, self.timeout_s, self._token = index, ports, timeout_s, token

    async def others(self, path: str) -> list[tuple[int, bytes]]:
        """(worker index, body) from every other worker that answered."""
        targets = [(i, p) for i, p in enumerate(self.ports) if i != self.index]
        results = await asyncio.gather(
            *(_get(p, path, self.timeout_s, self._token) for _, p in targets), return_exceptions=True
        )
        out = []
        for (i, _), r in zip(targets, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("worker %d did not answer %s (left out): %s", i, path, r or type(r).__name__)
            else:
                out.append((i, r))
        return out

    async def statistics(self, name: str, version: str) -> list[list[dict[str, Any]]]:
        if not name:
            path = "/v2/models/stats"
        elif version:
            path = f"/v2/models/{name}/versions/{version}/stats"
        else:
            path = f"/v2/models/{name}/stats"
        return [orjson.loads(body)["model_stats"] for _, body in await self.others(path)]

    async def metrics(self, local: bytes) -> bytes:
        return merge_metrics([(self.index, local), *await self.others("/metrics")])
