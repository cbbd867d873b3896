"""What the JSON routes of encoder models (``/v1/rerank``, ``/v1/classify`` and their TEI
twins) share: the body read and decoded, errors in the caller's format, and an answer with
``Server-Timing`` made of the model's stages.

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``, or, for a request in
TEI's shape, TEI's ``{"error", "error_type"}``, with the status of milliserve's one error
table.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

from milliserve.errors import InvalidInputError, MalformedRequestError, MilliserveError, NotFoundError
from milliserve.observability.timing import server_timing
from milliserve.openai.error_body import openai_error
from milliserve.protocol.json_codec import decode_json_object, encode_json
from milliserve.protocol.types import InferResponse
from milliserve.server.http.asgi import JSON_HEADER, Receive, Send
from milliserve.status import status_of

__all__ = ["Answer", "JsonRoute", "ReadBody", "bad"]

log = logging.getLogger(__name__)

ReadBody = Callable[[Any, Receive], Awaitable[bytes]]


def bad(message: str, param: str) -> InvalidInputError:
    """A 400 naming the request field at fault."""
    return InvalidInputError(message, param)


class Answer:
    """A route's answer: the JSON document and the model responses it came from."""

    __slots__ = ("doc", "responses")

    def __init__(self, doc: Any, responses: list[InferResponse]) -> None:
        self.doc, self.responses = doc, responses


class JsonRoute(ABC):
    """One POST route taking and answering JSON; a subclass implements ``answer``."""

    path = ""

    def __init__(self, read_body: ReadBody) -> None:
        self._read_body = read_body

    @abstractmethod
    async def answer(self, doc: dict[str, Any], tei: bool) -> Answer:
        """The answer to the request ``doc`` (``tei``: in TEI's shape)."""

    def tei_shaped(self, path: list[str], doc: dict[str, Any]) -> bool:
        """Whether the request is in TEI's shape (its errors are then TEI's)."""
        return False

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send, parts: list[str]) -> None:
        tei = False
        try:
            if scope["method"] != "POST":
                raise NotFoundError(f"no route for {scope['method']} /{'/'.join(parts)}; POST it")
            body = await self._read_body(scope, receive)
            t0 = time.perf_counter()
            if not body.strip():
                raise MalformedRequestError("the request body is empty; send a JSON object")
            doc = decode_json_object(body)
            tei = self.tei_shaped(parts, doc)
            t1 = time.perf_counter()
            answer = await self.answer(doc, tei)
            t2 = time.perf_counter()
            out = encode_json(answer.doc)
            t3 = time.perf_counter()
        except MilliserveError as exc:
            status = status_of(exc).http
            param = exc.args[1] if len(exc.args) > 1 else None
            await self._error(send, status, exc.message, param, tei)
            return
        except Exception:
            log.exception("unhandled error on POST /%s", "/".join(parts))
            await self._error(send, 500, "internal server error (logged)", None, tei)
            return
        stages: dict[str, float] = {"parse": t1 - t0}
        for r in answer.responses:
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

    async def _error(self, send: Send, status: int, message: str, param: str | None, tei: bool) -> None:
        if tei:
            kind = (
                "validation"
                if status in (400, 413, 422)
                else "overloaded"
                if status in (429, 503)
                else "backend"
            )
            body = encode_json({"error": message, "error_type": kind})
        else:
            body = encode_json(openai_error(status, message, param))
        headers = [JSON_HEADER, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
