"""The load generator's gRPC client for the tensor mode: ``ModelInfer`` calls with bodies
encoded once, on one grpc.aio channel (a real gRPC client, HTTP/2 multiplexed as
tritonclient's). Sends go out from the event loop, in open loops too: grpc.aio's calls
belong to the loop's thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from milliserve.bench.records import Recorder

__all__ = ["GrpcClient"]


class GrpcClient:
    """Sends pre-encoded ``ModelInferRequest`` bodies round-robin to ``host:port``."""

    send_now = None  # no sends from another thread

    def __init__(
        self, host: str, port: int, bodies: list[bytes], rec: Recorder, finished: Callable[[int], None]
    ):
        import grpc

        self.bodies, self.rec, self.finished = bodies, rec, finished
        self.channel: Any = grpc.aio.insecure_channel(f"{host}:{port}")
        self.call: Any = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    async def request(self, n: int, intended: float, phase: int) -> int:
        import grpc

        sent = time.monotonic()
        status, message = 200, ""
        try:
            await self.call(self.bodies[n % len(self.bodies)], timeout=60)
        except grpc.aio.AioRpcError as exc:
            status, message = 1000 + exc.code().value[0], exc.details() or ""
        self.rec.add(intended, phase, sent, time.monotonic(), status, message)
        self.finished(phase)
        return status

    async def close(self) -> None:
        await self.channel.close()
