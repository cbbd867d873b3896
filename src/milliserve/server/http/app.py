"""The Open Inference Protocol over HTTP, as a raw ASGI application.

No framework sits between the HTTP server and the dataplane: routing is a split of the
path, JSON goes through orjson, and the body size is limited while it is read.
The choice was measured (docs/benchmarks.md): a framework's routing and
request objects cost more than the whole tiny-model inference.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from milliserve.config.triton_json import config_to_dict
from milliserve.errors import (
    MalformedRequestError,
    MilliserveError,
    ModelNotReadyError,
    NotFoundError,
    RequestTooLargeError,
)
from milliserve.observability.timing import finish_stages
from milliserve.protocol.compression import decompress
from milliserve.protocol.json_codec import (
    decode_infer_request,
    decode_json_object,
    encode_infer_response,
    encode_json,
)
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.road import Offload
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.soon import Soon
from milliserve.server.auth import Auth
from milliserve.server.http.asgi import CANCEL_ON_DISCONNECT, CLIENT_GONE, JSON_HEADER, Receive, Scope, Send
from milliserve.server.http.classify import ClassifyRoute
from milliserve.server.http.cycle import Answer
from milliserve.server.http.edge_files import EdgeFiles
from milliserve.server.http.embeddings_route import EmbeddingsRoute
from milliserve.server.http.generate import GenerateRoutes
from milliserve.server.http.json_route import JsonRoute
from milliserve.server.http.rerank import RerankRoute
from milliserve.server.http.shm_routes import KINDS, SharedMemoryRoutes
from milliserve.server.shm.service import SharedMemoryService, SharedMemoryUse
from milliserve.status import status_of

__all__ = ["HttpApp"]

log = logging.getLogger(__name__)


_JSON = JSON_HEADER
_OCTET = (b"content-type", b"application/octet-stream")
_HEADER_LEN = b"inference-header-content-length"
_SERVER_TIMING = b"server-timing"
_DEADLINE = b"x-request-deadline-ms"
# the scope's key for a request the express lane decoded and left to the road
_DECODED = "milliserve.decoded_request"
_EMPTY_OK = b"{}"
_TEXT = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
# A body larger than this is decoded off the event loop (JSON numbers cost ~30 ns each).
OFFLOAD_BODY_BYTES = 64 * 1024


class HttpApp:
    """ASGI callable serving ``/v2/...`` for one DataPlane."""

    def __init__(
        self,
        dataplane: DataPlane,
        max_request_bytes: int,
        auth: Auth | None = None,
        offload: Offload | None = None,
        metrics: Callable[[], Awaitable[bytes]] | None = None,
        max_json_bytes: int = 2 << 20,
        edge: EdgeFiles | None = None,
        local_only: bool = False,
        shared_memory: SharedMemoryService | None = None,
    ) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes
        self.max_json_bytes = max_json_bytes
        self.auth = auth or Auth(None)
        self._offload = offload
        self._metrics = metrics  # /metrics here too, so tools need not know the metrics port
        self.generate = GenerateRoutes(dataplane, self._read_body)
        self.embeddings = EmbeddingsRoute(dataplane, self._read_body)
        rerank, classify = RerankRoute(dataplane, self._read_body), ClassifyRoute(dataplane, self._read_body)
        # encoder routes in OpenAI's, Cohere's (v1 and v2), infinity's and TEI's spellings
        self.encoder_routes: dict[str, JsonRoute] = {
            "v1/rerank": rerank,
            "v2/rerank": rerank,
            "rerank": rerank,
            "v1/classify": classify,
            "classify": classify,
            "predict": classify,
        }
        self.edge = edge
        self.local_only = local_only  # a worker's private listener: no fan-out to siblings
        self.shm = shared_memory or SharedMemoryService(False)
        self.shm_routes = SharedMemoryRoutes(self.shm, self._read_body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        parts = scope["path"].strip("/").split("/")
        if self.local_only and not (
            scope["method"] == "GET" and (parts == ["metrics"] or parts[-1:] == ["stats"])
        ):
            # a worker's private port answers its siblings' metrics and statistics only
            body = encode_json({"error": "a worker's private port serves /metrics and statistics only"})
            headers = [_JSON, (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 404, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        encoder = self.encoder_routes.get("/".join(parts))
        if encoder is not None or GenerateRoutes.handles(scope["method"], parts):
            try:
                self.auth.check(scope["headers"], "api")
            except MilliserveError as exc:
                body = encode_json({"error": {"message": exc.message, "type": "authentication_error"}})
                headers = [_JSON, (b"content-length", str(len(body)).encode())]
                headers.append((b"www-authenticate", b'Bearer realm="milliserve"'))
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            if encoder is not None:
                await encoder(scope, receive, send, parts)
                return
            if parts == ["v1", "embeddings"]:
                await self.embeddings(scope, receive, send)
                return
            await self.generate(scope, receive, send, parts)
            return
        try:
            if parts[0] == "edge":
                if self.edge is None:
                    raise NotFoundError("edge bundles are off: start the server with --edge DIR")
                await self.edge(scope, receive, send, parts)
                return
            status, body, headers = await self._route(scope, receive)
        except asyncio.CancelledError as exc:
            if exc.args[:1] == (CLIENT_GONE,):  # its client is gone: nothing to answer, no error
                return
            raise
        except MilliserveError as exc:
            status, body, headers = _error_answer(exc)
        except Exception:  # a bug: answer 500 for this request, keep serving, log the trace
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            status, body, headers = 500, encode_json({"error": "internal server error (logged)"}), [_JSON]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _read_body(self, scope: Scope, receive: Receive, json: bool = True) -> bytes:
        """The body, refused (413) as soon as it is known to be over the limit: the request
        limit, or for JSON the smaller JSON limit (decoding JSON holds the interpreter for
        ~5 ms per MB in one call; large tensors belong in the binary extension)."""
        body = await self._read_buffer(scope, receive, json)
        return body if isinstance(body, bytes) else bytes(body)

    async def _read_buffer(self, scope: Scope, receive: Receive, json: bool = True) -> bytes | bytearray:
        """As ``_read_body``, without the copy of a body that came in several pieces."""
        limit = min(self.max_request_bytes, self.max_json_bytes) if json else self.max_request_bytes
        what = "JSON request body" if json else "request body"
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    raise MalformedRequestError(
                        f"bad Content-Length {v.decode(errors='replace')!r}"
                    ) from None
                if declared > limit:
                    raise RequestTooLargeError(self._too_large(what, declared, limit, json))
        # a body in several pieces grows one buffer as they come: joining them at the end
        # copied all of it in one go on the event loop (a 30 MB body: 30-40 ms here, page
        # faults included), where growing it spreads that over the reads
        body: bytes | bytearray = b""
        grown: bytearray | None = None
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise MalformedRequestError("client disconnected before sending the whole body")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestTooLargeError(self._too_large(what, None, limit, json))
            if grown is not None:
                grown += chunk
            elif body:
                grown = bytearray(body)
                grown += chunk
            else:
                body = chunk
            if not msg.get("more_body", False):
                break
        if grown is not None:
            body = grown  # bytes-like (decoders take it as it is; it is not written to)
        encoding = next((v for k, v in scope["headers"] if k == b"content-encoding"), None)
        if encoding is None:
            return body
        name = encoding.decode("latin-1").strip().lower()
        body = bytes(body) if isinstance(body, bytearray) else body  # compressed: the smaller
        if len(body) > OFFLOAD_BODY_BYTES and self._offload is not None:
            inflated: bytes = await self._offload(decompress, body, name, limit)
            return inflated
        return decompress(body, name, limit)

    def _too_large(self, what: str, declared: int | None, limit: int, json: bool) -> str:
        size = f" of {declared} bytes" if declared is not None else ""
        hint = (
            "; send large tensors with the binary tensor extension"
            if json and limit < self.max_request_bytes
            else ""
        )
        return f"{what}{size} is over the limit of {limit} bytes{hint}"

    async def _route(self, scope: Scope, receive: Receive) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        method: str = scope["method"]
        parts = scope["path"].strip("/").split("/")
        if parts == ["metrics"] and method == "GET" and self._metrics is not None:
            self.auth.check(scope["headers"], "metrics")
            return 200, await self._metrics(), [_TEXT]
        if not parts or parts[0] != "v2":
            raise NotFoundError(f"no route for {scope['path']}; the API lives under /v2")
        rest = parts[1:]
        self.auth.check(scope["headers"], "health" if rest[:1] == ["health"] else "api")
        if method == "POST" and len(rest) >= 3 and rest[0] == "models" and rest[-1] == "infer":
            return await self._infer(scope, receive, rest)
        if method == "GET" and rest[-1:] == ["stats"] and rest[:1] == ["models"]:
            return await self._stats(rest)
        if rest[:1] and rest[0] in KINDS:
            return await self.shm_routes(scope, receive, rest)
        if method == "GET":
            return self._get(rest)
        if method == "POST" and rest[:1] == ["repository"]:
            return await self._repository(scope, receive, rest[1:])
        raise NotFoundError(f"no route for {method} {scope['path']}")

    @staticmethod
    def _model_ref(rest: list[str]) -> tuple[str, str, list[str]]:
        """Split ``models/{m}[/versions/{v}]/tail...`` into (model, version, tail)."""
        name = rest[1]
        if len(rest) >= 4 and rest[2] == "versions":
            return name, rest[3], rest[4:]
        return name, "", rest[2:]

    async def _infer(
        self, scope: Scope, receive: Receive, rest: list[str]
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        name, version, tail = self._model_ref(rest)
        if tail != ["infer"]:
            raise NotFoundError(f"no route for POST {scope['path']}")
        self.dp.model_ready(name, version)  # an unknown model is a 404 whatever the body says
        scope[CANCEL_ON_DISCONNECT] = True  # a client that leaves takes its request with it
        arrived = time.perf_counter()
        header_len: int | None = None
        deadline: float | None = None
        for k, v in scope["headers"]:
            if k == _HEADER_LEN:
                try:
                    header_len = int(v)
                except ValueError:
                    raise MalformedRequestError(
                        "Inference-Header-Content-Length must be an integer"
                    ) from None
            elif k == _DEADLINE:
                try:
                    ms = float(v)
                except ValueError:
                    ms = -1.0
                if not ms > 0 or ms == float("inf"):
                    raise MalformedRequestError(
                        "x-request-deadline-ms must be a positive number of milliseconds, "
                        f"got {v.decode(errors='replace')!r}"
                    )
                deadline = arrived + ms / 1000
        body = await self._read_buffer(scope, receive, json=header_len is None)
        if header_len is not None and header_len > self.max_json_bytes:
            raise RequestTooLargeError(
                f"the JSON header of {header_len} bytes is over the limit of {self.max_json_bytes} bytes"
            )
        t0 = time.perf_counter()  # from here on the time is the server's, not the network's
        client = scope.get("client")
        shm = self.shm.begin(client[0] if client else None)  # None: shared memory is off
        try:
            reader = shm.input if shm is not None else None
            decoded = scope.pop(_DECODED, None)  # by the express lane, which then left it to the road
            if decoded is not None:
                request = decoded
            elif len(body) > OFFLOAD_BODY_BYTES and self._offload is not None:
                request = await self._offload(decode_infer_request, body, header_len, name, version, reader)
            else:
                request = decode_infer_request(body, header_len, name, version, reader)
            request.deadline = deadline
            request.client = client  # (address, port): one connection
            if shm is not None and request.outputs:
                shm.bind_outputs(request)
            t1 = time.perf_counter()
            response = await self.dp.infer(request)
            t2 = time.perf_counter()
            if shm is not None:
                shm.write_outputs(response)
            return _answer(response, request, t0, t1, t2)
        finally:
            if shm is not None:
                shm.release()

    def express(self, scope: Scope, body: bytes) -> Answer | Soon[Answer] | None:
        """The express lane of ``POST /v2/models/{m}[/versions/{v}]/infer`` (docs/design.md,
        "The express lane"), for a request whose whole body is in: its answer computed in
        this call, where the model's road would not wait anywhere (``DataPlane.infer_now``).
        None for anything else (a compressed body, a deadline header, a body over a limit, a
        request that does not decode, a model whose road would wait): the request then takes
        the road (``__call__``), which answers it as always, its errors included."""
        if scope["method"] != "POST" or self.local_only:
            return None
        parts = scope["path"].strip("/").split("/")
        if len(parts) < 4 or parts[0] != "v2" or parts[1] != "models" or parts[-1] != "infer":
            return None
        name, version, tail = self._model_ref(parts[1:])
        if tail != ["infer"]:
            return None
        headers = scope["headers"]
        header_len: int | None = None
        for k, v in headers:
            if k == _HEADER_LEN:
                if not v.isdigit():
                    return None
                header_len = int(v)
            elif k == _DEADLINE or k == b"content-encoding":
                return None
        if header_len is None:
            if len(body) > min(self.max_request_bytes, self.max_json_bytes):
                return None
        elif len(body) > self.max_request_bytes or header_len > self.max_json_bytes:
            return None
        t0 = time.perf_counter()
        client = scope.get("client")
        # shared memory (when the server has it on): the request's regions are held from its
        # decoding until its answer is out, as on the road
        shm = self.shm.begin(client[0] if client else None) if self.shm.enabled else None
        try:
            self.auth.check(headers, "api")
            request = decode_infer_request(body, header_len, name, version, shm.input if shm else None)
            if shm is not None and request.outputs:
                shm.bind_outputs(request)
        except BaseException as exc:
            if shm is not None:
                shm.release()
            if isinstance(exc, MilliserveError):
                return None
            raise
        request.client = client
        try:
            t1 = time.perf_counter()
            response = self.dp.infer_now(request)
            if response is None:
                soon = self.dp.infer_soon(request)
                if soon is None:
                    if shm is not None:  # the road decodes it again, holding regions of its own
                        shm.release()
                        return None
                    # the road's: it takes the request as decoded here (a body the lane
                    # decodes has no deadline or compression to differ)
                    scope[_DECODED] = request
                    return None
                return soon.map(
                    lambda r: _answer_or_refusal(r, request, t0, t1, shm), lambda e: _error_or_raise(e, shm)
                )
        except BaseException as exc:
            if shm is not None:
                shm.release()
            if isinstance(exc, MilliserveError):
                return _error_answer(exc)
            raise
        return _answer_or_refusal(response, request, t0, t1, shm)

    def _get(self, rest: list[str]) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        dp = self.dp
        if not rest:
            return 200, encode_json(dp.server_metadata()), [_JSON]
        if rest[0] == "health" and len(rest) == 2:
            ok = dp.live() if rest[1] == "live" else dp.ready() if rest[1] == "ready" else None
            if ok is None:
                raise NotFoundError(f"no health endpoint {rest[1]!r}; use live or ready")
            return (200 if ok else 503), _EMPTY_OK, [_JSON]
        if rest[0] == "models" and len(rest) >= 2:
            name, version, tail = self._model_ref(rest)
            if not tail:
                return 200, encode_json(dp.model_metadata(name, version)), [_JSON]
            if tail == ["ready"]:
                try:
                    dp.model_ready(name, version)
                except ModelNotReadyError as exc:
                    return 503, encode_json({"error": exc.message}), [_JSON]
                return 200, _EMPTY_OK, [_JSON]
            if tail == ["config"]:
                return 200, encode_json(config_to_dict(dp.model_config(name, version))), [_JSON]
        raise NotFoundError(f"no route for GET /v2/{'/'.join(rest)}")

    async def _stats(self, rest: list[str]) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """Triton's statistics: of every model, one model, or one version (summed over the
        workers of ``serve --workers N``)."""
        stats_of = self.dp.model_statistics if self.local_only else None
        if rest == ["models", "stats"]:
            stats = stats_of() if stats_of else await self.dp.statistics()
        else:
            name, version, tail = self._model_ref(rest)
            if tail != ["stats"]:
                raise NotFoundError(f"no route for GET /v2/{'/'.join(rest)}")
            stats = stats_of(name, version) if stats_of else await self.dp.statistics(name, version)
        return 200, encode_json({"model_stats": stats}), [_JSON]

    async def _repository(
        self, scope: Scope, receive: Receive, rest: list[str]
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        # a load carries model files (base64 strings): bounded by the request limit, not the
        # JSON one, and decoded off the event loop when large
        body = await self._read_body(scope, receive, json=False)
        if len(body) > OFFLOAD_BODY_BYTES and self._offload is not None:
            doc = await self._offload(decode_json_object, body)
        else:
            doc = decode_json_object(body) if body.strip() else {}
        if rest == ["index"]:
            return 200, encode_json(self.dp.repository_index(bool(doc.get("ready", False)))), [_JSON]
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            params = doc.get("parameters") or {}
            if not isinstance(params, dict):
                raise MalformedRequestError("'parameters' must be an object")
            if rest[2] == "load":
                await self.dp.load_model(rest[1], params)
            else:
                await self.dp.unload_model(rest[1], params)
            return 200, _EMPTY_OK, [_JSON]
        raise NotFoundError(f"no route for POST /v2/repository/{'/'.join(rest)}")


def _answer(
    response: InferResponse, request: InferRequest, t0: float, t1: float, t2: float
) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """An inference's answer: the response encoded as the request asked (JSON, or the
    binary tensor extension), with its Server-Timing (decoding from ``t0`` to ``t1``, the
    servable until ``t2``, then the encoding)."""
    out, out_header_len = encode_infer_response(response, request)
    t3 = time.perf_counter()
    timing = (_SERVER_TIMING, finish_stages(response, t1 - t0, t3 - t2, t3 - t0).encode())
    if out_header_len is None:
        return 200, out, [_JSON, timing]
    return 200, out, [_OCTET, (_HEADER_LEN, str(out_header_len).encode()), timing]


def _answer_or_refusal(
    response: InferResponse, request: InferRequest, t0: float, t1: float, shm: SharedMemoryUse | None = None
) -> Answer:
    """``_answer``, or the refusal its encoding raised (as the road would answer it); with
    shared memory, the outputs written into their regions first and the regions released
    whatever happens."""
    try:
        if shm is not None:
            shm.write_outputs(response)
        return _answer(response, request, t0, t1, time.perf_counter())
    except MilliserveError as exc:
        return _error_answer(exc)
    finally:
        if shm is not None:
            shm.release()


def _error_or_raise(exc: BaseException, shm: SharedMemoryUse | None = None) -> Answer | BaseException:
    """A refused request's answer, for an express request answered later; any other
    exception passes on (the connection answers 500 and logs it). Its regions released."""
    if shm is not None:
        shm.release()
    return _error_answer(exc) if isinstance(exc, MilliserveError) else exc


def _error_answer(exc: MilliserveError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """A refused request's answer: its status from the one error table, the message as JSON."""
    status = status_of(exc).http
    headers = [_JSON]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="milliserve"'))
    return status, encode_json({"error": exc.message}), headers
