"""OpenAI's ``POST /v1/embeddings`` route: the request (parsed by ``openai/embeddings.py``)
translated for the data plane's embedder (``runtime/embedding.py``), the vectors quantized
to the asked type and written back as OpenAI's list of embeddings. Errors are OpenAI's
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from milliserve.errors import InvalidInputError, MalformedRequestError, MilliserveError, NotFoundError
from milliserve.observability.timing import server_timing
from milliserve.openai.embeddings import embeddings_response, parse_embeddings
from milliserve.openai.error_body import openai_error
from milliserve.protocol.json_codec import decode_json_object, encode_json
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.embedding_types import quantize
from milliserve.server.http.asgi import JSON_HEADER, Receive, Send
from milliserve.status import status_of

__all__ = ["EmbeddingsRoute"]

log = logging.getLogger(__name__)

ReadBody = Callable[[Any, Receive], Awaitable[bytes]]


class EmbeddingsRoute:
    """``POST /v1/embeddings`` for one HttpApp; errors go to its caller (OpenAI's format)."""

    def __init__(self, dataplane: DataPlane, read_body: ReadBody) -> None:
        self.dp = dataplane
        self._read_body = read_body

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            await self._embed(scope, receive, send)
        except MilliserveError as exc:
            status = status_of(exc).http
            param = (
                exc.args[1] if len(exc.args) > 1 else "input" if isinstance(exc, InvalidInputError) else None
            )
            await self._error(send, status, exc.message, param)
        except Exception:
            log.exception("unhandled error on POST /v1/embeddings")
            await self._error(send, 500, "internal server error (logged)", None)

    async def _error(self, send: Send, status: int, message: str, param: str | None) -> None:
        body = encode_json(openai_error(status, message, param))
        headers = [JSON_HEADER, (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="milliserve"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _embed(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            raise NotFoundError(f"no route for {scope['method']} /v1/embeddings; POST it")
        body = await self._read_body(scope, receive)
        t0 = time.perf_counter()
        if not body.strip():
            raise MalformedRequestError("the request body is empty; send a JSON object")
        request = parse_embeddings(decode_json_object(body))
        embedder = self.dp.embedder(request.model)
        t1 = time.perf_counter()
        kind, scale = request.embedding_type, embedder.spec.int8_scale
        if kind in ("int8", "uint8") and scale is None:
            raise InvalidInputError(
                f"model {request.model!r} has no int8 scale for embedding_type {kind!r}: its vectors are "
                "not normalised and its config sets no pooling.int8_scale",
                "embedding_type",
            )
        result = await embedder.embed(request.inputs, request.dimensions)
        t2 = time.perf_counter()
        vectors = quantize(result.vectors, kind, scale or 1.0)
        out = embeddings_response(request.model, vectors, result.tokens, request.base64)
        t3 = time.perf_counter()
        stages: dict[str, float] = {"parse": t1 - t0}
        for r in result.responses:
            for k, v in r.timings.items():
                stages[k] = stages.get(k, 0.0) + v
            if r.record_stages is not None:
                r.record_stages(r.timings)
        stages["serialize"] = t3 - t2
        headers = [
            JSON_HEADER,
            (b"content-length", str(len(out)).encode()),
            (b"server-timing", server_timing(stages, t3 - t0).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})
