"""Generation over HTTP: OpenAI's ``/v1/chat/completions`` (tools included),
``/v1/completions``, ``/v1/responses`` and ``/v1/models``, and Triton's generate
extension (``/v2/models/{m}/generate`` and ``/generate_stream``). Streams are
Server-Sent Events (``data: {...}`` then, for OpenAI's chat and completions,
``data: [DONE]``; the Responses API's events are named by ``event:`` lines).

While an answer runs, a watcher reads the connection: a client that disconnects cancels
its sequence at once, and one that stops reading a stream holds little
(``event_stream.py``).

Requests carry their client (the peer's address) to the engine's admission, which takes
turns between clients (llm/admission.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from milliserve.errors import (
    MalformedRequestError,
    MilliserveError,
    NotFoundError,
    RequestError,
)
from milliserve.llm.client import EngineClient, GenerationEvents
from milliserve.llm.generate_extension import parse_generate
from milliserve.llm.generation_params import GenerationParams
from milliserve.llm.sequence import Event
from milliserve.llm.tool_calls import CallParser, Piece, answer_pieces, call_parser, message_of, stream_delta
from milliserve.observability.request_trace import note_generation
from milliserve.openai.completions import (
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    new_id,
    parse_openai,
    server_timing,
)
from milliserve.openai.error_body import openai_error
from milliserve.openai.response_events import ResponseEvents, response_echo
from milliserve.openai.responses import parse_responses
from milliserve.protocol.json_codec import decode_json_object, encode_json
from milliserve.runtime.dataplane import DataPlane
from milliserve.server.http.asgi import JSON_HEADER, Receive, Send
from milliserve.server.http.event_stream import DONE, ClientGone, EventStreams, sse, typed_event
from milliserve.status import status_of

__all__ = ["GenerateRoutes"]

log = logging.getLogger(__name__)
_GENERATIVE = "a generative model"
_OPENAI_KINDS = "a generative, embedding, reranking or classifying model"


def _model(name: str, capabilities: list[str], created: int) -> dict[str, Any]:
    """OpenAI's model object, with what the model serves: generate, embed, rerank, classify."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "milliserve",
        "capabilities": capabilities,
    }


ReadBody = Callable[[Any, Receive], Awaitable[bytes]]

_JSON = JSON_HEADER


def _client_of(scope: dict[str, Any]) -> str:
    """Who sent the request, for fair admission: the peer's address (its port is not part
    of it: every connection has its own). A token would tell clients apart only if the
    server checked one per client; it checks one for all, and a header it did not check
    would let one client pose as many."""
    peer = scope.get("client")
    return str(peer[0]) if peer else ""


def _tool_finish(calls: int, finish: str | None) -> str:
    """OpenAI's finish reason of an answer that made ``calls`` calls: "tool_calls" when it
    ended on its own; a cut one keeps its reason (length)."""
    if calls and finish in (None, "stop"):
        return "tool_calls"
    return finish or "stop"


class GenerateRoutes:
    """The generation routes of one HttpApp."""

    def __init__(
        self,
        dataplane: DataPlane,
        read_body: ReadBody,
        write_timeout_s: float = 15.0,
        buffer_bytes: int = 64 << 10,
    ) -> None:
        self.dp = dataplane
        self._read_body = read_body
        self.disconnects = 0
        # the answers' streams: SSE, disconnects watched, writes bounded (event_stream.py)
        self.streams = EventStreams(write_timeout_s, buffer_bytes)

    def configure_streams(self, write_timeout_s: float, buffer_bytes: int) -> None:
        """What a stream whose client does not read may hold (``HttpSettings``)."""
        self.streams.configure(write_timeout_s, buffer_bytes)

    @staticmethod
    def handles(method: str, parts: list[str]) -> bool:
        if parts[:1] == ["v1"]:
            return True
        return (
            method == "POST"
            and len(parts) >= 4
            and parts[:2] == ["v2", "models"]
            and parts[-1]
            in (
                "generate",
                "generate_stream",
            )
        )

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send, parts: list[str]) -> None:
        openai = parts[0] == "v1"
        try:
            if openai:
                await self._openai(scope, receive, send, parts[1:])
            else:
                await self._generate(scope, receive, send, parts[2:])
        except ClientGone:
            self.disconnects += 1
        except MilliserveError as exc:
            await self._error(send, status_of(exc).http, exc.message, exc, openai)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await self._error(send, 500, "internal server error (logged)", None, openai)

    async def _error(self, send: Send, status: int, message: str, exc: Any, openai: bool) -> None:
        if openai:
            param = exc.args[1] if isinstance(exc, RequestError) and len(exc.args) > 1 else None
            body = encode_json(openai_error(status, message, param))
        else:
            body = encode_json({"error": message})
        headers = [_JSON, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _json(self, send: Send, doc: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        body = encode_json(doc)
        headers = [_JSON, (b"content-length", str(len(body)).encode()), *(extra or [])]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _body(self, scope: dict[str, Any], receive: Receive) -> Any:
        body = await self._read_body(scope, receive)
        if not body.strip():
            raise MalformedRequestError("the request body is empty; send a JSON object")
        return decode_json_object(body)

    # ---- OpenAI ----
    def _served(self) -> dict[str, list[str]]:
        """Generative models, then the embedding, reranking and classifying ones, each name
        once with what it serves (``capabilities``, as infinity's /models says it)."""
        served = {s.config.name: ["generate"] for s in self.dp.ready_as(EngineClient)}
        for name in self.dp.on_demand_models():  # loaded or not (llm_memory_mib)
            served.setdefault(name, ["generate"])
        for name, what in self.dp.encoder_capabilities().items():
            served.setdefault(name, []).extend(what)
        return served

    async def _openai(self, scope: dict[str, Any], receive: Receive, send: Send, rest: list[str]) -> None:
        method = scope["method"]
        if method == "GET" and rest == ["models"]:
            now = int(time.time())
            data = [_model(n, what, now) for n, what in self._served().items()]
            loaded = self.dp.on_demand_models()
            for doc in data:  # models on demand: loaded or not (llama-server's router says so)
                if doc["id"] in loaded:
                    doc["status"] = {"value": "loaded" if loaded[doc["id"]] else "unloaded"}
            await self._json(send, {"object": "list", "data": data})
            return
        if method == "GET" and len(rest) == 2 and rest[0] == "models":
            what = self._served().get(rest[1])
            if what is None:  # why not: unknown (404), or no model of these routes (400)
                self.dp.servable_as(EngineClient, rest[1], what=_OPENAI_KINDS)
                what = ["generate"]
            await self._json(send, _model(rest[1], what, int(time.time())))
            return
        if method == "POST" and rest == ["responses"]:
            await self._responses(scope, receive, send)
            return
        if method != "POST" or rest not in (["chat", "completions"], ["completions"]):
            raise NotFoundError(f"no route for {method} {scope['path']}")
        chat = rest[0] == "chat"
        params = parse_openai(await self._body(scope, receive), chat)
        params.client = _client_of(scope)
        servable: EngineClient = await self.dp.acquire_as(EngineClient, params.model, what=_GENERATIVE)
        if params.tools is not None:  # its own road: the plain chat's stays as it is
            await self._tool_chat(servable, params, receive, send)
            return
        if not params.stream:
            text, last = await self.streams.complete(servable.complete(params), receive)
            note_generation(params.model, last.timing, last.usage, last.finish)
            build = chat_response if chat else completion_response
            timing = server_timing(last.timing).encode()
            await self._json(
                send,
                build(params.model, text, last.finish or "stop", last.usage),
                [(b"server-timing", timing)],
            )
            return
        t0 = time.perf_counter_ns()
        stream = await servable.generate(params)
        rid, created, model = new_id(chat), int(time.time()), params.model

        def chunks() -> Any:
            async def gen() -> Any:
                if chat:
                    yield sse(chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
                async for ev in stream.events():
                    if ev.finish is None:
                        if chat:
                            yield sse(chat_chunk(rid, model, created, {"content": ev.text}))
                        else:
                            yield sse(completion_chunk(rid, model, created, ev.text))
                        continue
                    note_generation(model, ev.timing, ev.usage, ev.finish)
                    timing = None if params.include_usage else ev.timing
                    if chat:
                        delta = {"content": ev.text} if ev.text else {}
                        yield sse(chat_chunk(rid, model, created, delta, ev.finish, timing=timing))
                    else:
                        yield sse(completion_chunk(rid, model, created, ev.text, ev.finish, timing=timing))
                    if params.include_usage:
                        build = chat_chunk if chat else completion_chunk
                        yield sse(build(rid, model, created, None, usage=ev.usage, timing=ev.timing))
                yield DONE

            return gen()

        await self.streams.stream(servable, stream, receive, send, chunks(), t0)

    async def _tool_chat(
        self, servable: EngineClient, params: GenerationParams, receive: Receive, send: Send
    ) -> None:
        """A chat that may call tools: its text read by the call parser of its format, calls
        sent as ``tool_calls`` (streamed: name first, then argument fragments), never as
        content; ``finish_reason`` "tool_calls" when it made some."""
        model = params.model
        t0 = time.perf_counter_ns()
        stream = await servable.generate(params)
        parser = call_parser(params.tools)
        if not params.stream:
            pieces, last = await self._whole(servable, params, receive, stream, parser, t0)
            finish = _tool_finish(parser.calls, last.finish)
            doc = chat_response(model, "", finish, last.usage, message_of(pieces))
            await self._json(send, doc, [(b"server-timing", server_timing(last.timing).encode())])
            return
        rid, created = new_id(True), int(time.time())

        async def gen() -> Any:
            yield sse(chat_chunk(rid, model, created, {"role": "assistant", "content": None}))
            async for pieces, ev in answer_pieces(stream, parser):
                for delta in stream_delta(pieces):
                    yield sse(chat_chunk(rid, model, created, delta))
                if ev is None:
                    continue
                note_generation(model, ev.timing, ev.usage, ev.finish)
                finish = _tool_finish(parser.calls, ev.finish)
                timing = None if params.include_usage else ev.timing
                yield sse(chat_chunk(rid, model, created, {}, finish, timing=timing))
                if params.include_usage:
                    yield sse(chat_chunk(rid, model, created, None, usage=ev.usage, timing=ev.timing))
            yield DONE

        await self.streams.stream(servable, stream, receive, send, gen(), t0)

    async def _whole(
        self,
        servable: EngineClient,
        params: GenerationParams,
        receive: Receive,
        stream: GenerationEvents,
        parser: CallParser | None,
        t0: int,
    ) -> tuple[list[Piece], Event]:
        """A non-streamed answer's pieces and last event, counted and noted."""

        async def whole() -> tuple[list[Piece], Event]:
            out: list[Piece] = []
            try:
                async for pieces, last in answer_pieces(stream, parser):
                    out += pieces
                    if last is not None:
                        return out, last
            finally:
                stream.cancel()
            raise ClientGone  # the events ended without a last one: cancelled

        try:
            pieces, last = await self.streams.complete(whole(), receive)
        except ClientGone:
            servable.record(t0, asyncio.CancelledError())
            raise
        except BaseException as exc:
            servable.record(t0, exc)
            raise
        servable.record(t0, None)
        note_generation(params.model, last.timing, last.usage, last.finish)
        return pieces, last

    async def _responses(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """OpenAI's Responses API, stateless (openai/responses.py): the chat it amounts to,
        answered as a ``response`` object or its typed events."""
        doc = await self._body(scope, receive)
        params = parse_responses(doc)
        params.client = _client_of(scope)
        servable: EngineClient = await self.dp.acquire_as(EngineClient, params.model, what=_GENERATIVE)
        t0 = time.perf_counter_ns()
        stream = await servable.generate(params)
        parser = call_parser(params.tools) if params.tools is not None else None
        answer = ResponseEvents(params.model, response_echo(doc))
        if not params.stream:
            pieces, last = await self._whole(servable, params, receive, stream, parser, t0)
            answer.feed(pieces)
            final = answer.finish(last.finish, last.usage)[-1]["response"]
            await self._json(send, final, [(b"server-timing", server_timing(last.timing).encode())])
            return

        async def gen() -> Any:
            for event in answer.start():
                yield typed_event(event)
            async for pieces, ev in answer_pieces(stream, parser):
                for event in answer.feed(pieces):
                    yield typed_event(event)
                if ev is not None:
                    note_generation(params.model, ev.timing, ev.usage, ev.finish)
                    for event in answer.finish(ev.finish, ev.usage):
                        yield typed_event(event)

        await self.streams.stream(servable, stream, receive, send, gen(), t0)

    # ---- Triton's generate extension ----
    async def _generate(self, scope: dict[str, Any], receive: Receive, send: Send, rest: list[str]) -> None:
        name, version = rest[0], ""
        if len(rest) >= 4 and rest[1] == "versions":
            version = rest[2]
        servable: EngineClient = await self.dp.acquire_as(EngineClient, name, version, _GENERATIVE)
        params = parse_generate(await self._body(scope, receive))
        params.client = _client_of(scope)
        streaming = rest[-1] == "generate_stream"
        head = {"model_name": servable.config.name, "model_version": servable.version}
        if not streaming:
            text, last = await self.streams.complete(servable.complete(params), receive)
            note_generation(servable.config.name, last.timing, last.usage, last.finish)
            doc = {**head, "text_output": text, "finish_reason": last.finish, "usage": last.usage}
            await self._json(send, doc, [(b"server-timing", server_timing(last.timing).encode())])
            return
        t0 = time.perf_counter_ns()
        stream = await servable.generate(params)

        async def gen() -> Any:
            async for ev in stream.events():
                doc: dict[str, Any] = {**head, "text_output": ev.text}
                if ev.finish is not None:
                    note_generation(servable.config.name, ev.timing, ev.usage, ev.finish)
                    doc.update(
                        finish_reason=ev.finish, usage=ev.usage, server_timing=server_timing(ev.timing)
                    )
                elif not ev.text:
                    continue
                yield sse(doc)

        await self.streams.stream(servable, stream, receive, send, gen(), t0)
