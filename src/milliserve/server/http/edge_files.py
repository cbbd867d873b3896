"""``/edge/<model>/...``: the browser bundles written by ``milliserve edge build``, served as
static files (off unless ``edge.dir`` is set).

Every answer carries the headers that make the page cross-origin isolated (COOP/COEP), which
onnxruntime-web needs for WASM threads, and CORP so that nothing else may embed the files.
Files with a content hash or a version in their path (the model, the tokenizer, ORT's
runtime) are cached for good; the rest (page, script, manifest) are revalidated with an ETag.
Only regular files inside a bundle folder are served: no dotfiles, no ``..``, no symlink out.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

from milliserve.errors import ConfigError, NotFoundError
from milliserve.road import Offload
from milliserve.server.http.asgi import JSON_HEADER, Scope, Send

__all__ = ["EdgeFiles"]

log = logging.getLogger(__name__)

_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".mjs": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".json": b"application/json",
    ".wasm": b"application/wasm",
    ".onnx": b"application/octet-stream",
    ".txt": b"text/plain; charset=utf-8",
    ".png": b"image/png",
}
_ISOLATION = [
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-embedder-policy", b"require-corp"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
]
# model.<hash>.onnx, tokenizer.<hash>.json, ort-<version>/...: the name changes with the content
_IMMUTABLE = re.compile(r"(^|/)(ort-[0-9][^/]*/|[a-z_]+\.[0-9a-f]{12}\.[a-z]+$)")
_CHUNK = 1 << 20
_SMALL = 256 << 10


class EdgeFiles:
    def __init__(self, root: Path, immutable_max_age_s: int, offload: Offload | None = None) -> None:
        if not root.is_dir():
            raise ConfigError(f"edge.dir {root}: no such folder (write bundles with milliserve edge build)")
        self.root = root.resolve()
        self.immutable = f"public, max-age={immutable_max_age_s}, immutable".encode()
        self._offload = offload
        found = self.bundles()
        log.info("edge bundles in %s: %s", self.root, ", ".join(found) or "none yet")

    def bundles(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "manifest.json").is_file())

    def _file(self, parts: list[str]) -> tuple[Path, str] | None:
        """The file a path names, or None (a missing or forbidden path is a plain 404)."""
        name, rest = parts[0], parts[1:] or ["index.html"]
        if rest[-1] == "":
            rest = [*rest[:-1], "index.html"]
        for part in (name, *rest):
            if not part or part.startswith(".") or "\\" in part or "\x00" in part:
                return None
        bundle = self.root / name
        if not (bundle / "manifest.json").is_file():
            return None
        path = bundle.joinpath(*rest)
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(bundle.resolve()) or not real.is_file():
            return None
        return real, "/".join(rest)

    async def __call__(self, scope: Scope, send: Send, parts: list[str]) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            body = b'{"error": "the edge files take GET and HEAD"}'
            await _answer(send, 405, body, [JSON_HEADER, (b"allow", b"GET, HEAD")])
            return
        rest = parts[1:]
        if not rest or rest == [""]:
            import orjson

            body = orjson.dumps({"bundles": self.bundles()})
            await _answer(send, 200, body, [JSON_HEADER])
            return
        if len(rest) == 1 and not scope["path"].endswith("/"):  # /edge/m -> /edge/m/ (relative URLs)
            await _answer(send, 308, b"", [(b"location", f"/edge/{rest[0]}/".encode())])
            return
        found = self._file(rest)
        if found is None:
            here = ", ".join(self.bundles()) or "none"
            raise NotFoundError(f"no edge file {scope['path']}; bundles here: {here}")
        path, relative = found
        stat = path.stat()
        etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'.encode()
        headers = [
            (b"content-type", _TYPES.get(path.suffix, b"application/octet-stream")),
            (b"cache-control", self.immutable if _IMMUTABLE.search(relative) else b"no-cache"),
            (b"etag", etag),
            *_ISOLATION,
        ]
        if any(k == b"if-none-match" and etag in v for k, v in scope["headers"]):
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        headers.append((b"content-length", str(stat.st_size).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if method == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        await self._send_file(path, stat.st_size, send)

    async def _send_file(self, path: Path, size: int, send: Send) -> None:
        """The file in 1 MiB chunks, each read off the event loop (a model is tens of MB)."""
        if self._offload is None:  # in-process tests without an executor
            await send({"type": "http.response.body", "body": await asyncio.to_thread(path.read_bytes)})
            return
        if size <= _SMALL:
            await send({"type": "http.response.body", "body": await self._offload(path.read_bytes)})
            return
        f = await self._offload(path.open, "rb")
        with f:
            while True:
                chunk = await self._offload(f.read, _CHUNK)
                more = len(chunk) == _CHUNK
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
                if not more:
                    return


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, *_ISOLATION, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
