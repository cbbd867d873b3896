"""The OIP gRPC service (``inference.GRPCInferenceService``) over grpc.aio.

Handlers are registered by hand under Triton's service name so that
``tritonclient.grpc`` and perf_analyzer reach them; see protocol/proto/oip.proto
for why the proto package differs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from milliserve import errors as e
from milliserve.config.model_config import config_to_proto
from milliserve.errors import MilliserveError, ModelNotReadyError
from milliserve.observability.timing import finish_stages
from milliserve.protocol import grpc_codec
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.runtime.dataplane import DataPlane

__all__ = ["SERVICE_NAME", "build_grpc_server"]

log = logging.getLogger(__name__)
SERVICE_NAME = "inference.GRPCInferenceService"


def grpc_status(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status for an exception raised by the dataplane."""
    table: list[tuple[type[BaseException], grpc.StatusCode]] = [
        (e.RequestTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (e.RequestError, grpc.StatusCode.INVALID_ARGUMENT),
        (e.NotFoundError, grpc.StatusCode.NOT_FOUND),
        (e.UnavailableError, grpc.StatusCode.UNAVAILABLE),
        (e.QueueTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (e.DeadlineUnmeetableError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (e.ModelControlDisabledError, grpc.StatusCode.PERMISSION_DENIED),
        (e.BackendError, grpc.StatusCode.INTERNAL),
    ]
    for cls, code in table:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


class Servicer:
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

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

    async def _infer(self, req: Any, ctx: Any) -> tuple[Any, str]:
        """One request; returns the response message and its Server-Timing value."""
        t0 = time.perf_counter()
        remaining = ctx.time_remaining()  # the client's gRPC deadline, if it set one
        request = grpc_codec.decode_infer_request(req)
        if remaining is not None:
            request.deadline = t0 + remaining
        t1 = time.perf_counter()
        response = await self.dp.infer(request)
        t2 = time.perf_counter()
        out = grpc_codec.encode_infer_response(response)
        t3 = time.perf_counter()
        return out, finish_stages(response, t1 - t0, t3 - t2, t3 - t0)

    async def ModelConfig(self, req: Any, ctx: Any) -> Any:
        return pb.ModelConfigResponse(config=config_to_proto(self.dp.model_config(req.name, req.version)))

    async def ModelStatistics(self, req: Any, ctx: Any) -> Any:
        stats = self.dp.model_statistics(req.name, req.version)
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

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], ctx: Any) -> AsyncIterator[Any]:
        # Requests of one stream run concurrently (so they can share batches); responses
        # go out as they complete, each carrying its request id.
        finished: asyncio.Queue[Any] = asyncio.Queue()

        async def one(msg: Any) -> None:
            try:
                resp, _ = await self._infer(msg, ctx)
                await finished.put(pb.ModelStreamInferResponse(infer_response=resp))
            except MilliserveError as exc:
                failed = pb.ModelInferResponse(id=msg.id, model_name=msg.model_name)
                await finished.put(
                    pb.ModelStreamInferResponse(error_message=exc.message, infer_response=failed)
                )

        async def read_all() -> None:
            async with asyncio.TaskGroup() as group:
                async for msg in requests:
                    group.create_task(one(msg))
            await finished.put(None)  # the stream ended and every request was answered

        reader = asyncio.create_task(read_all())
        try:
            while (item := await finished.get()) is not None:
                yield item
        finally:
            reader.cancel()


def _wrap_unary(fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(req: Any, ctx: Any) -> Any:
        try:
            return await fn(req, ctx)
        except MilliserveError as exc:
            await ctx.abort(grpc_status(exc), exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("unhandled error in gRPC handler")
            await ctx.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")

    return handler


def build_grpc_server(dataplane: DataPlane, max_message_bytes: int) -> grpc.aio.Server:
    """A grpc.aio server with the inference service registered (not yet bound or started)."""
    servicer = Servicer(dataplane)
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        req_cls = getattr(pb, method.input_type.name)
        resp_cls = getattr(pb, method.output_type.name)
        fn = getattr(servicer, method.name)
        if method.client_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                fn, request_deserializer=req_cls.FromString, response_serializer=resp_cls.SerializeToString
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _wrap_unary(fn),
                request_deserializer=req_cls.FromString,
                response_serializer=resp_cls.SerializeToString,
            )
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    return server
