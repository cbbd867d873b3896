"""A minimal OpenAI-compatible streaming server whose timing you choose.

Used to calibrate ``milliserve bench --llm`` (with zero delays it measures the tool's
own floor) and to test its client against a known truth. It is *not* a model: it
streams ``tok`` words, one chunk every ``itl_ms`` after ``ttft_ms``. It answers
``/v1/chat/completions`` and ``/v1/completions`` with SSE over chunked
transfer-encoding as OpenAI's servers do (a role-only first chunk, content chunks,
a ``finish_reason`` chunk, a ``usage`` chunk when asked, ``data: [DONE]``), and
can make the stream hard to read on purpose: CRLF line ends, events written in
two pieces, keep-alive comments, several tokens per chunk, cumulative usage on each
chunk, a ``Server-Timing`` header (``streams`` in it: the answers in flight as this
one began), and every Nth request failed with a 500, an error
inside the stream, or a connection cut mid-stream. It also answers ``/v1/embeddings``
(model ``fake-embed``: a zero vector per input after ``--embed-ms``), for the embeddings
mode::

    python -m milliserve.bench.fake_openai --port 9000 --ttft-ms 50 --itl-ms 10

Plain asyncio, no framework: its own cost stays in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from milliserve.bench.fake_server import HttpHandler, module_server_process, run_until_interrupted

__all__ = ["FakeLlm", "fake_openai_process", "serve_fake_openai"]

MODEL = "fake-llm"
EMBED_MODEL = "fake-embed"
MODELS = orjson.dumps(
    {
        "object": "list",
        "data": [{"id": m, "object": "model", "owned_by": "milliserve"} for m in (MODEL, EMBED_MODEL)],
    }
)


@dataclass(frozen=True)
class FakeLlm:
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens: int = 16  # per answer, at most the request's max_tokens
    tokens_per_chunk: int = 1
    crlf: bool = False
    split: bool = False  # write each event in two pieces, the cut inside a line
    comments: bool = False  # a ": keep-alive" comment before each event
    continuous_usage: bool = False  # cumulative usage on every chunk (vLLM's continuous_usage_stats)
    server_timing: bool = False
    error_every: int = 0  # every Nth request: 500 with an OpenAI error body
    stream_error_every: int = 0  # every Nth: 200, then an error object half-way
    cut_every: int = 0  # every Nth: the connection closes half-way
    embed_ms: float = 0.0  # /v1/embeddings: the delay of each answer
    embed_dim: int = 8


def _head(status: str, headers: dict[str, str]) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()


def _plain(status: str, body: bytes) -> bytes:
    return _head(status, {"content-type": "application/json", "content-length": str(len(body))}) + body


class _Handler(HttpHandler):
    def __init__(self, b: FakeLlm, state: dict[str, int]) -> None:
        super().__init__()
        self.b, self.state = b, state

    async def answer(self, method: str, path: str, body: bytes) -> bool:
        if path.endswith("/v1/models"):
            self.transport.write(_plain("200 OK", MODELS))
        elif path.startswith("/health"):
            self.transport.write(_plain("200 OK", b"{}"))
        elif method == "POST" and path.endswith("/v1/embeddings"):
            await self._embed(body)
        elif method == "POST" and path.endswith(("/v1/chat/completions", "/v1/completions")):
            return await self._complete(path.endswith("/chat/completions"), body)
        else:
            self.transport.write(_plain("404 Not Found", b'{"error": {"message": "no such route"}}'))
        return True

    async def _embed(self, body: bytes) -> None:
        """One zero vector of ``embed_dim`` floats per input, after ``embed_ms``."""
        self.state["count"] += 1
        if self.b.error_every and self.state["count"] % self.b.error_every == 0:
            err = orjson.dumps({"error": {"message": "fake overload", "type": "server_error", "code": 500}})
            self.transport.write(_plain("500 Internal Server Error", err))
            return
        doc = orjson.loads(body)
        if doc.get("model") != EMBED_MODEL:
            what = {"message": f"model {doc.get('model')!r} does not embed", "type": "invalid_request_error"}
            self.transport.write(_plain("404 Not Found", orjson.dumps({"error": what})))
            return
        inputs = doc.get("input")
        n = len(inputs) if isinstance(inputs, list) else 1
        if self.b.embed_ms:
            await asyncio.sleep(self.b.embed_ms / 1e3)
        data = [{"object": "embedding", "index": i, "embedding": [0.0] * self.b.embed_dim} for i in range(n)]
        usage = {"prompt_tokens": 7 * n, "total_tokens": 7 * n}
        doc = {"object": "list", "data": data, "model": EMBED_MODEL, "usage": usage}
        self.transport.write(_plain("200 OK", orjson.dumps(doc)))

    async def _complete(self, chat: bool, body: bytes) -> bool:
        """Stream one answer; False when the connection was cut on purpose."""
        self.state["active"] += 1
        try:
            return await self._stream(chat, body)
        finally:
            self.state["active"] -= 1

    async def _stream(self, chat: bool, body: bytes) -> bool:
        b = self.b
        self.state["count"] += 1
        n = self.state["count"]
        if b.error_every and n % b.error_every == 0:
            err = orjson.dumps({"error": {"message": "fake overload", "type": "server_error", "code": 500}})
            self.transport.write(_plain("500 Internal Server Error", err))
            return True
        req = orjson.loads(body)
        total = max(0, min(b.tokens, int(req.get("max_tokens") or b.tokens)))
        want_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        headers = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
        if b.server_timing:
            # "streams": how many answers were in flight as this one began, this one included
            headers["server-timing"] = f"queue;dur=0.25, prefill;dur=1.5, streams;dur={self.state['active']}"
        self.transport.write(_head("200 OK", headers))
        eol = "\r\n" if b.crlf else "\n"
        base = {"id": f"cmpl-{n}", "created": int(time.time()), "model": MODEL}
        base["object"] = "chat.completion.chunk" if chat else "text_completion"

        async def event(doc: dict[str, Any] | str) -> None:
            data = doc if isinstance(doc, str) else orjson.dumps(base | doc).decode()
            text = (f": keep-alive{eol}{eol}" if b.comments else "") + f"data: {data}{eol}{eol}"
            raw = text.encode()
            pieces = [raw[: len(raw) // 2], raw[len(raw) // 2 :]] if b.split else [raw]
            for p in pieces:
                self.transport.write(f"{len(p):x}\r\n".encode() + p + b"\r\n")
                if b.split:
                    await asyncio.sleep(0.0005)

        def choice(text: str, finish: str | None = None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        if chat:
            await event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(b.ttft_ms / 1e3)
        sent = 0
        while sent < total:
            k = min(b.tokens_per_chunk, total - sent)
            if sent and b.itl_ms:
                await asyncio.sleep(b.itl_ms / 1e3)
            if b.cut_every and n % b.cut_every == 0 and sent >= total // 2:
                self.transport.close()
                return False
            if b.stream_error_every and n % b.stream_error_every == 0 and sent >= total // 2:
                await event({"error": {"message": "fake failure mid-stream", "type": "server_error"}})
                break
            sent += k
            doc: dict[str, Any] = {"choices": [choice("tok " * k)]}
            if b.continuous_usage:
                doc["usage"] = {"prompt_tokens": 7, "completion_tokens": sent, "total_tokens": 7 + sent}
            await event(doc)
        else:
            await event(
                {"choices": [choice("", "length" if total == int(req.get("max_tokens") or -1) else "stop")]}
            )
            if want_usage:
                usage = {"prompt_tokens": 7, "completion_tokens": total, "total_tokens": 7 + total}
                await event({"choices": [], "usage": usage})
        await event("[DONE]")
        self.transport.write(b"0\r\n\r\n")
        return True


async def serve_fake_openai(port: int, behaviour: FakeLlm, host: str = "127.0.0.1") -> None:
    """Serve until cancelled."""
    loop = asyncio.get_running_loop()
    state = {"count": 0, "active": 0}
    server = await loop.create_server(lambda: _Handler(behaviour, state), host, port)
    async with server:
        await server.serve_forever()


@contextmanager
def fake_openai_process(*args: str) -> Iterator[str]:
    """Run the fake server in a subprocess on a free loopback port (``args`` as on its
    command line); yields its base URL once it answers, and stops it on exit."""
    with module_server_process("milliserve.bench.fake_openai", "/health", "fake OpenAI server", *args) as url:
        yield url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    for name in ("ttft-ms", "itl-ms", "embed-ms"):
        ap.add_argument(f"--{name}", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=16)
    for name in ("tokens-per-chunk",):
        ap.add_argument(f"--{name}", type=int, default=1)
    for name in ("error-every", "stream-error-every", "cut-every"):
        ap.add_argument(f"--{name}", type=int, default=0)
    for flag in ("crlf", "split", "comments", "continuous-usage", "server-timing"):
        ap.add_argument(f"--{flag}", action="store_true")
    a = ap.parse_args()
    behaviour = FakeLlm(
        a.ttft_ms,
        a.itl_ms,
        a.tokens,
        a.tokens_per_chunk,
        a.crlf,
        a.split,
        a.comments,
        a.continuous_usage,
        a.server_timing,
        a.error_every,
        a.stream_error_every,
        a.cut_every,
        a.embed_ms,
    )
    run_until_interrupted(serve_fake_openai(a.port, behaviour))


if __name__ == "__main__":
    main()
