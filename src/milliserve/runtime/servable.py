"""What the data plane serves: a ``Servable`` (a model version, a pipeline, later a
generative model), found through a ``ServableRegistry``.

``RoadServable`` is the common body of servables whose requests walk a road of stages
(``milliserve.road``): it times the request, records its outcome in the statistics
(failure reasons from the one error table) and builds the response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from milliserve.config.model_config import ModelConfig
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.road import Call, Road, SpanLog
from milliserve.runtime.soon import Soon
from milliserve.runtime.stats import ModelStats
from milliserve.status import status_of

__all__ = ["HEDGE_LOST", "ClientInputs", "RoadServable", "Servable", "ServableRegistry", "model_metadata"]

# the message a hedged step cancels its losing copies with: the replica counts them apart
HEDGE_LOST = "hedge lost"

# (name, datatype, dims) of what a client sends
ClientInputs = list[tuple[str, str, tuple[int, ...]]]


class Servable(Protocol):
    """One servable version, loaded and accepting requests."""

    config: ModelConfig
    version: str
    stats: ModelStats

    def metadata(self, versions: list[str]) -> dict[str, Any]: ...

    def client_inputs(self) -> ClientInputs: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Responses for one request as they are produced (one for a one-shot servable)."""
        ...

    async def close(self) -> None: ...


class ServableRegistry(Protocol):
    """Where the data plane finds servables (``repository.model_registry.ModelRegistry``)."""

    def get(self, name: str, version: str = "") -> Servable: ...

    def versions(self, name: str) -> list[str]: ...

    def all_ready(self) -> list[Servable]: ...

    # whether error messages and the index may list the models
    expose_names: bool

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]: ...

    def is_loading(self) -> bool: ...

    def unavailable(self) -> list[str]: ...

    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load or reload ``name``; ``parameters``: a load request's overrides (config, files)."""
        ...

    async def unload(self, name: str) -> None: ...

    async def ensure_loaded(self, name: str) -> None:
        """Load ``name`` if it is a model that loads on demand and is not loaded."""
        ...

    def on_demand_models(self) -> dict[str, bool]:
        """Models that load on demand, and whether each is loaded."""
        ...


class RoadServable:
    """A servable whose requests walk ``road``; subclasses build the road when they load."""

    config: ModelConfig
    version: str
    stats: ModelStats
    road: Road
    platform: str

    async def infer(self, request: InferRequest) -> InferResponse:
        """Walk the road and answer. Errors propagate after being counted in the statistics."""
        if request.trace is not None:
            return await self._traced(request)
        t0 = time.perf_counter_ns()
        call = Call(request)
        try:
            outputs = await self.road(call)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and exc.args[:1] == (HEDGE_LOST,):
                self.stats.hedges_lost += 1  # not a failure: another replica answered first
            else:
                self.stats.record_request(time.perf_counter_ns() - t0, status_of(exc).reason)
            raise
        response = InferResponse(
            model_name=self.config.name,
            model_version=self.version,
            id=request.id,
            outputs=outputs,
            parameters=call.notes,
            timings=call.stages,
            record_stages=self.stats.record_stages,
        )
        self.stats.record_request(time.perf_counter_ns() - t0, None)
        return response

    def infer_now(self, request: InferRequest) -> InferResponse | None:
        """The express lane: ``request`` answered at once, without awaiting, where its road
        would have answered it so anyway; None where it would not (the default), and the
        front end takes the road (``infer``). A servable whose road can wait (a pipeline, a
        cache, a sequence) keeps the default."""
        return None

    def infer_soon(self, request: InferRequest) -> Soon[InferResponse] | None:
        """The express lane under load: ``request``, which ``infer_now`` left, answered later
        in this loop turn without awaiting (a model's turn batch, ``ModelRuntime``); None
        where it would not be (the default), and the front end takes the road."""
        return None

    async def _traced(self, request: InferRequest) -> InferResponse:
        """``infer`` for a traced request: the road that records spans, under one span for
        this servable (``model NAME`` or ``pipeline NAME``)."""
        log: SpanLog = request.trace
        kind = "pipeline" if self.platform == "ensemble" else "model"
        attributes = {"milliserve.model.name": self.config.name, "milliserve.model.version": self.version}
        index = log.open(f"{kind} {self.config.name}", time.perf_counter(), attributes)
        call = Call(request)
        t0 = time.perf_counter_ns()
        try:
            outputs = await self.road.traced(call)
        except BaseException as exc:
            log.close(index, time.perf_counter(), {"error.type": type(exc).__name__, "error": str(exc)})
            if isinstance(exc, asyncio.CancelledError) and exc.args[:1] == (HEDGE_LOST,):
                self.stats.hedges_lost += 1
            else:
                self.stats.record_request(time.perf_counter_ns() - t0, status_of(exc).reason)
            raise
        log.close(index, time.perf_counter(), {"milliserve.batch_size": call.batch_size})
        response = InferResponse(
            model_name=self.config.name,
            model_version=self.version,
            id=request.id,
            outputs=outputs,
            parameters=call.notes,
            timings=call.stages,
            record_stages=self.stats.record_stages,
        )
        self.stats.record_request(time.perf_counter_ns() - t0, None)
        return response

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        yield await self.infer(request)

    def client_inputs(self) -> ClientInputs:
        return [(t.name, t.data_type, t.dims) for t in self.config.input]

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        return model_metadata(self.config, versions, self.platform, self.client_inputs())


def model_metadata(
    config: ModelConfig, versions: list[str], platform: str, inputs: ClientInputs
) -> dict[str, Any]:
    """OIP model metadata: ``inputs`` as (name, datatype, dims) are what a client sends."""
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(section: Any) -> list[dict[str, Any]]:
        return [{"name": n, "datatype": d, "shape": batch + list(dims)} for n, d, dims in section]

    return {
        "name": config.name,
        "versions": versions,
        "platform": platform,
        "inputs": tensors(inputs),
        "outputs": tensors((t.name, t.data_type, t.dims) for t in config.output),
    }
