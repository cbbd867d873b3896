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
from milliserve.server.http.asgi import JSON_HEADER, Receive, Scope, Send

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
# large files streamed at once; more downloads wait their turn (their bytes cost CPU that
# inference needs: 40 parallel model downloads made the deadline check refuse requests)
MAX_STREAMS = 4
SEND_TIMEOUT_S = 30.0


class EdgeFiles:
    def __init__(self, root: Path, immutable_max_age_s: int, offload: Offload | None = None) -> None:
        if not root.is_dir():
            raise ConfigError(f"edge.dir {root}: no such folder (write bundles with milliserve edge build)")
        if (root / "manifest.json").is_file():
            raise ConfigError(
                f"edge.dir {root} is one bundle: give the folder that holds bundles ({root.parent})"
            )
        self.root = root.resolve()
        self.immutable = f"public, max-age={immutable_max_age_s}, immutable".encode()
        self._offload = offload
        self._streams = asyncio.Semaphore(MAX_STREAMS)
        found = self.bundles()
        log.info("edge bundles in %s: %s", self.root, ", ".join(found) or "none yet")

    def bundles(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "manifest.json").is_file())

    def _bundle(self, name: str) -> Path | None:
        """The bundle folder ``name``: inside the root (a symlink out is not followed)."""
        if not name or name.startswith(".") or "\\" in name or "\x00" in name:
            return None
        try:
            bundle = (self.root / name).resolve(strict=True)
            if not bundle.is_relative_to(self.root) or not (bundle / "manifest.json").is_file():
                return None
        except (OSError, RuntimeError):  # too long, a loop, not there
            return None
        return bundle

    def _file(self, parts: list[str]) -> tuple[Path, str] | None:
        """The file a path names, or None (a missing or forbidden path is a plain 404)."""
        rest = parts[1:] or ["index.html"]
        if rest[-1] == "":
            rest = [*rest[:-1], "index.html"]
        if any(not p or p.startswith(".") or "\\" in p or "\x00" in p for p in rest):
            return None
        bundle = self._bundle(parts[0])
        if bundle is None:
            return None
        try:
            real = bundle.joinpath(*rest).resolve(strict=True)
            if not real.is_relative_to(bundle) or not real.is_file():
                return None
        except (OSError, RuntimeError):
            return None
        return real, "/".join(rest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, parts: list[str]) -> None:
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
        # /edge/m -> /edge/m/ (the page's relative URLs), for a bundle that exists
        if len(rest) == 1 and not scope["path"].endswith("/") and self._bundle(rest[0]) is not None:
            query = scope.get("query_string", b"")
            location = f"/edge/{rest[0]}/".encode() + (b"?" + query if query else b"")
            await _answer(send, 308, b"", [(b"location", location)])
            return
        found = self._file(rest)
        if found is None:
            here = ", ".join(self.bundles()) or "none"
            raise NotFoundError(f"no edge file {scope['path']!r}; bundles here: {here}")
        path, relative = found
        stat = path.stat()
        etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'.encode()
        headers = [
            (b"content-type", _TYPES.get(path.suffix, b"application/octet-stream")),
            (b"cache-control", self.immutable if _IMMUTABLE.search(relative) else b"no-cache"),
            (b"etag", etag),
            *_ISOLATION,
        ]
        if _not_modified(scope["headers"], etag):
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        headers.append((b"content-length", str(stat.st_size).encode()))
        if method == "HEAD":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        async with self._streams:  # a few large downloads at a time: inference keeps the CPU
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            try:
                await self._send_file(path, stat.st_size, receive, send)
            except Exception as exc:  # the headers are out: the connection is all there is to end
                log.warning("edge file %s: stopped mid-response (%s)", relative, exc)

    async def _send_file(self, path: Path, size: int, receive: Receive, send: Send) -> None:
        """The file in 1 MiB chunks, each read off the event loop (a model is tens of MB);
        a client that goes away stops the reading."""
        offload = self._offload or (lambda fn, *a: asyncio.to_thread(fn, *a))
        if size <= _SMALL:
            await send({"type": "http.response.body", "body": await offload(path.read_bytes)})
            return
        gone = asyncio.ensure_future(_disconnected(receive))
        f = await offload(path.open, "rb")
        try:
            sent = 0
            while not gone.done():
                chunk = await offload(f.read, _CHUNK)
                sent += len(chunk)
                more = bool(chunk) and sent < size
                # a client that stops reading holds a download slot: not for longer than this
                await asyncio.wait_for(
                    send({"type": "http.response.body", "body": chunk, "more_body": more}), SEND_TIMEOUT_S
                )
                if not more:
                    return
        finally:
            gone.cancel()
            await offload(f.close)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _not_modified(headers: list[tuple[bytes, bytes]], etag: bytes) -> bool:
    """If-None-Match as RFC 9110 reads it: ``*``, or a listed tag equal to ours (weakly)."""
    for k, v in headers:
        if k == b"if-none-match":
            for tag in v.split(b","):
                tag = tag.strip()
                if tag == b"*" or tag.removeprefix(b"W/") == etag:
                    return True
    return False


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, *_ISOLATION, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
