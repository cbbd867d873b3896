"""OpenAI's ``POST /v1/embeddings``: the request translated for the data plane's embedder
(``runtime/embedding.py``), the vectors written back as OpenAI's list of embeddings, floats
or base64 (little-endian float32, what the ``openai`` SDK asks for by default).

``input`` is a string, a list of strings, a list of token ids or a list of such lists (at
most 2048 inputs, OpenAI's limit); ``encoding_format`` ``float`` (default) or ``base64``;
``dimensions`` a smaller size where the model allows it; ``embedding_type`` ``float``
(default), ``int8``, ``uint8``, ``binary`` or ``ubinary`` (infinity's types, quantized as
``runtime/embedding_types.py`` says: integers in JSON, the raw bytes in base64); ``user`` is
accepted and has no effect. Any other field is refused with a 400 that names it, as OpenAI does. Errors are
OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError, MalformedRequestError, MilliserveError, NotFoundError
from milliserve.llm.protocol import openai_error
from milliserve.observability.timing import server_timing
from milliserve.protocol.json_codec import decode_json_object, encode_json
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.embedding_types import EMBEDDING_TYPES, quantize
from milliserve.server.http.asgi import JSON_HEADER, Receive, Send
from milliserve.status import status_of

__all__ = ["MAX_INPUTS", "EmbeddingsRequest", "EmbeddingsRoute", "embeddings_response", "parse_embeddings"]

log = logging.getLogger(__name__)

MAX_INPUTS = 2048
_FIELDS = ("model", "input", "encoding_format", "dimensions", "embedding_type", "user")

ReadBody = Callable[[Any, Receive], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    inputs: list[str] | list[list[int]]
    base64: bool
    dimensions: int | None
    embedding_type: str = "float"


def _bad(message: str, param: str) -> InvalidInputError:
    return InvalidInputError(message, param)


def _token_list(value: list[Any], where: str) -> list[int]:
    if not value:
        raise _bad(f"{where} is an empty list of token ids", "input")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**31:
            raise _bad(f"{where} holds {v!r}; token ids are integers from 0", "input")
    return value


def _inputs(raw: Any) -> list[str] | list[list[int]]:
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        what = "an empty list" if isinstance(raw, list) else type(raw).__name__
        raise _bad(
            f"'input' is {what}; give a string, a list of strings, a list of token ids or a list "
            "of lists of token ids",
            "input",
        )
    if len(raw) > MAX_INPUTS:
        raise _bad(f"'input' has {len(raw)} items; at most {MAX_INPUTS} go in one request", "input")
    first = raw[0]
    if isinstance(first, str):
        for i, v in enumerate(raw):
            if not isinstance(v, str):
                raise _bad(f"'input' mixes strings and {type(v).__name__} (item {i})", "input")
        return raw
    if isinstance(first, int) and not isinstance(first, bool):
        return [_token_list(raw, "'input'")]
    if isinstance(first, list):
        out = []
        for i, v in enumerate(raw):
            if not isinstance(v, list):
                raise _bad(f"'input' mixes lists of token ids and {type(v).__name__} (item {i})", "input")
            out.append(_token_list(v, f"'input' item {i}"))
        return out
    raise _bad(f"'input' holds {type(first).__name__}; give strings or token ids", "input")


def parse_embeddings(doc: dict[str, Any]) -> EmbeddingsRequest:
    """The request, checked; InvalidInputError (400) naming the offending field."""
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise _bad(f"unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: the name of an embedding model (GET /v1/models)", "model")
    if "input" not in doc:
        raise _bad("'input' is required", "input")
    fmt = doc.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise _bad(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    dims = doc.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise _bad(f"'dimensions' must be a positive integer, got {dims!r}", "dimensions")
    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad(f"'user' must be a string, got {type(user).__name__}", "user")
    kind = doc.get("embedding_type", "float")
    kind = "float" if kind == "float32" else kind  # infinity spells it float32
    if kind not in EMBEDDING_TYPES:
        raise _bad(
            f"'embedding_type' must be one of {', '.join(EMBEDDING_TYPES)}, got {kind!r}", "embedding_type"
        )
    return EmbeddingsRequest(model, _inputs(doc["input"]), fmt == "base64", dims, kind)


def embeddings_response(model: str, vectors: np.ndarray[Any, Any], tokens: int, b64: bool) -> bytes:
    """OpenAI's answer: one embedding per row of ``vectors``, in order: float32 vectors as
    floats, or as little-endian float32 bytes in base64; int8 or uint8 ones (compact
    embedding types) as integers, or their bytes in base64."""
    if b64:
        rows = vectors.astype("<f4", copy=False) if vectors.dtype.kind == "f" else vectors
        items: list[Any] = [base64.b64encode(r.tobytes()).decode("ascii") for r in rows]
    elif vectors.dtype.kind == "f":
        items = list(np.ascontiguousarray(vectors, dtype=np.float32))
    else:
        items = vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return encode_json({"object": "list", "data": data, "model": model, "usage": usage})


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
            raise _bad(
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
