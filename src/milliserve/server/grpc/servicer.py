"""The OIP gRPC service (``inference.GRPCInferenceService``): one servicer for both
stacks, milliserve's own HTTP/2 listener (native.py, the default) and grpc.aio.

Handlers are registered by hand under Triton's service name so that
``tritonclient.grpc`` and perf_analyzer reach them; see protocol/proto/oip.proto
for why the proto package differs. Every handler takes the request's raw bytes and
parses them itself, so an undecodable message is INVALID_ARGUMENT (without internals)
on both stacks, and a bad message inside ``ModelStreamInfer`` gets an error reply while
the stream goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from milliserve.config.triton_json import config_to_proto
from milliserve.errors import MalformedRequestError, MilliserveError, ModelNotReadyError
from milliserve.observability.timing import finish_stages
from milliserve.observability.tracing import TracedDataPlane
from milliserve.protocol import grpc_codec
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.protocol.types import InferResponse
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.soon import Soon
from milliserve.server.auth import Auth, Route
from milliserve.server.shm.service import SharedMemoryService, SharedMemoryUse
from milliserve.status import status_of

__all__ = ["SERVICE_NAME", "CallCount", "build_grpc_server", "grpc_error", "service_methods"]

log = logging.getLogger(__name__)
SERVICE_NAME = "inference.GRPCInferenceService"
# health methods, open without a token unless the settings close them
_HEALTH = frozenset({"ServerLive", "ServerReady", "ModelReady"})
# requests of one stream in flight at once; the stream reads no further until one finishes
MAX_STREAM_INFLIGHT = 256


class CallCount:
    """Calls the service has taken up: a draining server waits until no new one starts, so
    calls a client sent just before SIGTERM are served, not cancelled by the stop."""

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started = 0


def grpc_error(exc: BaseException, where: str) -> tuple[grpc.StatusCode, str]:
    """The status and message for an exception (the one error table); an unexpected one is
    logged with its trace and answered INTERNAL without internals."""
    if isinstance(exc, MilliserveError):
        return grpc.StatusCode[status_of(exc).grpc], exc.message
    log.error("unhandled error in gRPC %s", where, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal server error (logged)"


def peer_host(ctx: Any) -> str | None:
    """The client's address: the native stack's context has it; grpc.aio's ``peer()`` spells
    it ``ipv4:127.0.0.1:port`` or ``ipv6:[::1]:port``."""
    host = getattr(ctx, "peer_host", None)
    if host is not None:
        return str(host)
    peer = ctx.peer() if hasattr(ctx, "peer") else ""
    kind, _, rest = str(peer).partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return None


def client_of(ctx: Any) -> object:
    """The call's client connection (what the batcher's queue takes turns between): the
    native stack's connection, grpc.aio's ``peer()`` (address and port)."""
    conn = getattr(ctx, "connection", None)
    if conn is not None:
        return conn
    return str(ctx.peer()) if hasattr(ctx, "peer") else None


class Servicer:
    def __init__(
        self, dataplane: DataPlane, auth: Auth, calls: CallCount, shm: SharedMemoryService | None = None
    ) -> None:
        self.dp = dataplane
        self.auth = auth
        self.calls = calls
        self.shm = shm or SharedMemoryService(False)
        if isinstance(dataplane, TracedDataPlane):  # a SERVER span per call, chosen once
            self.ModelInfer = dataplane.tracing.grpc_unary(  # type: ignore[method-assign,assignment]
                f"{SERVICE_NAME}/ModelInfer", self.ModelInfer
            )

    async def ServerLive(self, req: Any, ctx: Any) -> Any:
        return pb.ServerLiveResponse(live=self.dp.live())

    async def ServerReady(self, req: Any, ctx: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.dp.ready())

    async def ModelReady(self, req: Any, ctx: Any) -> Any:
        try:
            self.dp.model_ready(req.name, req.version)
        except ModelNotReadyError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, req: Any, ctx: Any) -> Any:
        return json_format.ParseDict(self.dp.server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, req: Any, ctx: Any) -> Any:
        return json_format.ParseDict(
            self.dp.model_metadata(req.name, req.version), pb.ModelMetadataResponse()
        )

    async def ModelInfer(self, req: Any, ctx: Any) -> Any:
        out, timing = await self._infer(req, ctx)
        ctx.set_trailing_metadata((("server-timing", timing),))
        return out

    @staticmethod
    def _decode(req: Any, ctx: Any, shm: SharedMemoryUse | None = None) -> Any:
        t0 = time.perf_counter()
        remaining = ctx.time_remaining()  # the client's gRPC deadline, if it set one
        reader = shm.input if shm is not None else None
        if isinstance(req, SplitInferRequest):
            request = grpc_codec.decode_infer_request(req.msg, reader, req.raw_contents)
        else:
            request = grpc_codec.decode_infer_request(req, reader)
        if remaining is not None:
            request.deadline = t0 + remaining
        request.client = client_of(ctx)
        if shm is not None and request.outputs:
            shm.bind_outputs(request)
        return request

    async def _infer(self, req: Any, ctx: Any) -> tuple[Any, str]:
        """One request; returns the response message and its Server-Timing value."""
        t0 = time.perf_counter()
        shm = self.shm.begin(peer_host(ctx))  # None: shared memory is off
        try:
            request = self._decode(req, ctx, shm)
            t1 = time.perf_counter()
            # the express lane (as HTTP's): at once where the model's road would not wait,
            # else in this loop turn's batch, else the road; with shared memory too, its
            # regions held until the answer is written (the ``finally`` below)
            response = self.dp.infer_now(request)
            if response is None:
                soon = self.dp.infer_soon(request)
                response = await self.dp.infer(request) if soon is None else await _settled(soon)
            t2 = time.perf_counter()
            written = shm.write_outputs(response) if shm is not None else ()
            out = grpc_codec.encode_infer_response(response, written)
        finally:
            if shm is not None:
                shm.release()
        t3 = time.perf_counter()
        return out, finish_stages(response, t1 - t0, t3 - t2, t3 - t0)

    async def ModelConfig(self, req: Any, ctx: Any) -> Any:
        return pb.ModelConfigResponse(config=config_to_proto(self.dp.model_config(req.name, req.version)))

    async def ModelStatistics(self, req: Any, ctx: Any) -> Any:
        stats = await self.dp.statistics(req.name, req.version)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, req: Any, ctx: Any) -> Any:
        rows = self.dp.repository_index(req.ready)
        return json_format.ParseDict({"models": rows}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, req: Any, ctx: Any) -> Any:
        await self.dp.load_model(req.model_name, grpc_codec.parameters_from_proto(req.parameters))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, req: Any, ctx: Any) -> Any:
        await self.dp.unload_model(req.model_name, grpc_codec.parameters_from_proto(req.parameters))
        return pb.RepositoryModelUnloadResponse()

    # ---- shared memory (Triton's extension; off unless --shared-memory system) ----
    async def SystemSharedMemoryStatus(self, req: Any, ctx: Any) -> Any:
        out = pb.SystemSharedMemoryStatusResponse()
        for row in self.shm.system_status(req.name, peer_host(ctx)):
            out.regions[row["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**row))
        return out

    async def SystemSharedMemoryRegister(self, req: Any, ctx: Any) -> Any:
        self.shm.system_register(req.name, req.key, req.offset, req.byte_size, peer_host(ctx))
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, req: Any, ctx: Any) -> Any:
        self.shm.system_unregister(req.name, peer_host(ctx))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, req: Any, ctx: Any) -> Any:
        self.shm.cuda_status(req.name, peer_host(ctx))
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, req: Any, ctx: Any) -> Any:
        self.shm.cuda_register(req.name, peer_host(ctx))
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, req: Any, ctx: Any) -> Any:
        self.shm.cuda_unregister(req.name, peer_host(ctx))
        return pb.CudaSharedMemoryUnregisterResponse()

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes | None], ctx: Any) -> AsyncIterator[Any]:
        # Requests of one stream run concurrently (so they can share batches, up to
        # MAX_STREAM_INFLIGHT at once); responses go out as they complete, each carrying its
        # request id. A failed request is answered with error_message and never ends the stream.
        self.calls.started += 1
        self.auth.check_grpc(ctx.invocation_metadata(), "api")
        finished: asyncio.Queue[Any] = asyncio.Queue()
        slots = asyncio.Semaphore(MAX_STREAM_INFLIGHT)
        # answers not yet taken by the transport: a client that reads none stops the
        # requests being read (its request slots stay held), instead of answers piling up
        unsent = asyncio.Semaphore(MAX_STREAM_INFLIGHT)

        async def one(raw: bytes | None) -> None:
            msg = pb.ModelInferRequest()
            shm = self.shm.begin(peer_host(ctx))
            try:
                parsed = _parse(pb.ModelInferRequest, raw)
                msg = parsed.msg if isinstance(parsed, SplitInferRequest) else parsed
                request = self._decode(parsed, ctx, shm)
                async for response in self.dp.stream(request):
                    written = shm.write_outputs(response) if shm is not None else ()
                    encoded = grpc_codec.encode_infer_response(response, written)
                    await unsent.acquire()
                    finished.put_nowait(pb.ModelStreamInferResponse(infer_response=encoded))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _, message = grpc_error(exc, "ModelStreamInfer")
                failed = pb.ModelInferResponse(
                    id=msg.id, model_name=msg.model_name, model_version=msg.model_version
                )
                await unsent.acquire()
                finished.put_nowait(pb.ModelStreamInferResponse(error_message=message, infer_response=failed))
            finally:
                if shm is not None:
                    shm.release()
                slots.release()

        async def read_all() -> None:
            running: set[asyncio.Task[None]] = set()
            try:
                async for msg in requests:
                    await slots.acquire()
                    task = asyncio.create_task(one(msg))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(running)
            except asyncio.CancelledError:
                for task in running:
                    task.cancel()
                raise
            except Exception as exc:  # the stream itself broke (client gone): nothing to answer
                log.debug("gRPC stream ended: %r", exc)
            finally:
                finished.put_nowait(None)  # the stream ended and every request was answered

        reader = asyncio.create_task(read_all())
        try:
            while (item := await finished.get()) is not None:
                yield item
                unsent.release()
        finally:
            reader.cancel()


@dataclass(frozen=True, slots=True)
class SplitInferRequest:
    """A large ModelInferRequest parsed without its ``raw_input_contents``, which stay views
    of the received message (grpc_codec.split_raw_contents)."""

    msg: Any
    raw_contents: list[memoryview]


# a ModelInferRequest larger than this is parsed without copying its raw tensor contents
SPLIT_BYTES = 64 * 1024


async def _settled(soon: Soon[InferResponse]) -> InferResponse:
    """The response a ``Soon`` brings later in this loop turn (a turn's batch), awaited."""
    future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()

    def settle(value: InferResponse | BaseException) -> None:
        if future.done():  # the call was cancelled: nobody reads the answer
            return
        if isinstance(value, asyncio.CancelledError):
            future.cancel()
        elif isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    soon.then(settle)
    return await future


def _parse(cls: Any, raw: bytes | memoryview | None) -> Any:
    if raw is None:
        raise MalformedRequestError(
            f"the message is not a valid {cls.DESCRIPTOR.name} (it cannot be decoded)"
        )
    try:
        if cls is pb.ModelInferRequest and len(raw) > SPLIT_BYTES:
            split = grpc_codec.split_raw_contents(raw)
            if split is not None:
                return SplitInferRequest(cls.FromString(split[0]), split[1])
        return cls.FromString(raw)
    except DecodeError:
        raise MalformedRequestError(
            f"the message is not a valid {cls.DESCRIPTOR.name} (it cannot be decoded)"
        ) from None


def _wrap_unary(
    fn: Callable[[Any, Any], Awaitable[Any]], req_cls: Any, auth: Auth, route: Route, calls: CallCount
) -> Callable[[bytes, Any], Awaitable[Any]]:
    async def handler(raw: bytes, ctx: Any) -> Any:
        calls.started += 1
        try:
            auth.check_grpc(ctx.invocation_metadata(), route)
            return await fn(_parse(req_cls, raw), ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, message = grpc_error(exc, getattr(fn, "__name__", "call"))
        # Abort outside the except block, with the request dropped: the exception's traceback
        # holds the request's tensors, and an abort raised while it is being handled would
        # chain it (and keep that memory) for as long as gRPC keeps the abort.
        del raw
        await ctx.abort(code, message)

    return handler


def service_methods(
    dataplane: DataPlane, auth: Auth, calls: CallCount, shm: SharedMemoryService | None = None
) -> dict[str, tuple[Callable[..., Any], Any, bool]]:
    """Each method of the service by name: its handler (raw request bytes, or an iterator
    of them for the stream, and a context), its response class, and whether it streams."""
    servicer = Servicer(dataplane, auth, calls, shm)
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods: dict[str, tuple[Callable[..., Any], Any, bool]] = {}
    for method in service.methods:
        resp_cls = getattr(pb, method.output_type.name)
        fn = getattr(servicer, method.name)
        if method.client_streaming:
            methods[method.name] = (fn, resp_cls, True)
        else:
            req_cls = getattr(pb, method.input_type.name)
            route: Route = "health" if method.name in _HEALTH else "api"
            methods[method.name] = (_wrap_unary(fn, req_cls, auth, route, calls), resp_cls, False)
    return methods


def build_grpc_server(
    dataplane: DataPlane,
    max_message_bytes: int,
    auth: Auth | None = None,
    options: list[tuple[str, Any]] | None = None,
    calls: CallCount | None = None,
    shm: SharedMemoryService | None = None,
) -> grpc.aio.Server:
    """A grpc.aio server with the inference service registered (not yet bound or started):
    the ``grpc.stack: grpcio`` choice, kept to measure against and as a fallback."""
    auth = auth or Auth(None)
    calls = calls or CallCount()
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name, (fn, resp_cls, streaming) in service_methods(dataplane, auth, calls, shm).items():
        make = grpc.stream_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
        # no request deserializer: the handlers parse (and refuse) the bytes themselves
        handlers[name] = make(fn, response_serializer=resp_cls.SerializeToString)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *(options or []),
        ]
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    return server
