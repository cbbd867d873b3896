"""OpenTelemetry traces of the stages ``Server-Timing`` carries, exported over OTLP/HTTP.

Off unless an endpoint is configured (``--otlp-endpoint``, ``MILLISERVE_TRACING__OTLP_ENDPOINT``
or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``); then the server is built with tracing in
three places, and nothing else changes:

- the HTTP application is wrapped (``TracedHttp``) and the gRPC ``ModelInfer`` handler too
  (``Tracing.grpc_unary``): each request gets a SERVER span, the child of the caller's W3C
  ``traceparent`` when it sends one;
- the data plane is a ``TracedDataPlane``: each inference it runs carries a ``SpanLog`` in
  which the servable's road records its spans (``milliserve.road``): the servable (``model
  NAME`` / ``pipeline NAME``), then its stages (parse, features, preprocess, cache, queue,
  infer, postprocess), a pipeline's steps each as a span with its models' spans inside;
- generation routes note their request's queue time, time to first token, token counts
  and finish reason (``request_trace.note_generation``) on a ``generate MODEL`` span.

Without tracing the road is the plain one: a servable checks ``request.trace is None``, one
branch per request, and no OpenTelemetry module is imported. The spans are made when the
request ends, from the times the road recorded, as plain records handed to a child process
that encodes and exports them (``observability/span_export.py``: encoding in this process
took the GIL from the event loop).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from milliserve._version import __version__
from milliserve.observability.request_trace import CURRENT_TRACE, RequestTrace, Sampled
from milliserve.observability.span_export import Record, SpanPipe, quiet_drops
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.road import SpanLog
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.soon import Soon
from milliserve.status import status_of

__all__ = [
    "DEFAULT_SAMPLE_RATIO",
    "TracedDataPlane",
    "TracedHttp",
    "Tracing",
]


Scope = dict[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]

# the share of requests traced that bring no caller's decision, unless OTEL_TRACES_SAMPLER
# says otherwise: every request traced costs the loop its spans' records, and the exporting
# child a core's share (at thousands of requests a second, every request sampled makes the
# p99 tens of times tracing off on 2 vCPUs; benchmarks/server_overhead.py)
DEFAULT_SAMPLE_RATIO = 0.01
_PROPAGATED = frozenset(("traceparent", "tracestate"))
_PROPAGATED_BYTES = frozenset(name.encode() for name in _PROPAGATED)

_GRPC_ERRORS = {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
_GRPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}


class TracedDataPlane(DataPlane):
    """The data plane of a server that traces: each inference in a traced request records
    its servable's spans (a request with several, such as a long embeddings request, gets
    them all, side by side)."""

    def __init__(self, tracing: Tracing, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracing = tracing

    def infer_now(self, request: InferRequest) -> InferResponse | None:
        """A traced request takes the road, which records its spans."""
        return None if CURRENT_TRACE.get() is not None else super().infer_now(request)

    def infer_soon(self, request: InferRequest) -> Soon[InferResponse] | None:
        """A traced request takes the road, which records its spans."""
        return None if CURRENT_TRACE.get() is not None else super().infer_soon(request)

    async def infer(self, request: InferRequest) -> InferResponse:
        trace = CURRENT_TRACE.get()
        if trace is None:
            return await super().infer(request)
        log = request.trace = SpanLog()
        start = time.perf_counter()
        try:
            return await super().infer(request)
        finally:
            end = time.perf_counter()
            trace.log.absorb(log)
            trace.first = start if trace.first is None else min(trace.first, start)
            trace.last = end if trace.last is None else max(trace.last, end)


def _route(path: str) -> str | None:
    """The route template of ``path`` (bounded: model names become ``{model_name}``), or None
    for a path the server does not route."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["v1"] and len(parts) <= 3:
        if len(parts) == 3 and parts[1] == "models":
            return "/v1/models/{model}"
        return "/" + "/".join(parts)
    if parts[:1] != ["v2"]:
        return "/metrics" if parts == ["metrics"] else None
    out = ["v2"]
    for i, p in enumerate(parts[1:], 1):
        prev = parts[i - 1]
        out.append("{model_name}" if prev == "models" else "{model_version}" if prev == "versions" else p)
    return "/" + "/".join(out)


class Tracing:
    """Spans from finished requests, exported to ``endpoint`` (an OTLP/HTTP collector's
    traces URL) by a child process (``span_export.SpanPipe``)."""

    def __init__(
        self,
        endpoint: str,
        service_name: str = "milliserve",
        timeout_s: float = 10.0,
        sample_ratio: float = DEFAULT_SAMPLE_RATIO,
    ) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = endpoint
        # the provider holds the sampler only: OTEL_TRACES_SAMPLER when set; else a caller's
        # decision (traceparent), and ``sample_ratio`` of the requests that bring none
        sampler, root = _sampler(sample_ratio)
        self.provider = TracerProvider(sampler=sampler)
        # the default sampler's bound on a trace id without a parent (``decide``); None: another
        # sampler (OTEL_TRACES_SAMPLER), asked every time
        self._root_bound: int | None = root.bound if root is not None else None
        self._ids = RandomIdGenerator()
        self._api = trace
        self._propagator = TraceContextTextMapPropagator()
        # perf_counter seconds to epoch nanoseconds (spans carry wall-clock times)
        self._epoch_ns = time.time_ns() - int(time.perf_counter() * 1e9)
        quiet_drops()
        # the SDK's batch processor's schedule (OTEL_BSP_SCHEDULE_DELAY, ms) is how often
        # spans leave; 1 s unless set (the SDK's 5 s is long to wait for a trace)
        interval_s = _env_ms("OTEL_BSP_SCHEDULE_DELAY", 1000.0) / 1e3
        self.pipe = SpanPipe(endpoint, service_name, __version__, timeout_s, interval_s)

    def _ns(self, t: float) -> int:
        return self._epoch_ns + int(t * 1e9)

    def shutdown(self) -> None:
        """Export what is pending, then stop the exporter."""
        self.pipe.close()
        self.provider.shutdown()

    # ---- spans ----
    def decide(self, name: str, kind: str, carrier: dict[str, str]) -> Sampled | None:
        """Whether the request arriving now is traced (the sampler decides once, before any
        of its work, so that a request that is not pays nothing for tracing): its trace and
        parent when it is, None when not. ``carrier``: its ``traceparent`` and
        ``tracestate``, if it sent them."""
        if not carrier and self._root_bound is not None:
            # a request that brings no parent, under the default sampler: its trace id decides
            # (TraceIdRatioBased's rule), and most are dropped before any of the SDK's objects
            trace_id = self._ids.generate_trace_id()
            if trace_id & _TRACE_ID_LIMIT >= self._root_bound:
                return None
            return self._sample(None, None, trace_id, name, kind)
        context = self._propagator.extract(carrier) if carrier else None
        parent = self._api.get_current_span(context).get_span_context() if context is not None else None
        parent_ctx = parent if parent is not None and parent.is_valid else None
        trace_id = parent_ctx.trace_id if parent_ctx is not None else self._ids.generate_trace_id()
        return self._sample(context, parent_ctx, trace_id, name, kind)

    def _sample(self, context: Any, parent_ctx: Any, trace_id: int, name: str, kind: str) -> Sampled | None:
        """The sampler's decision for a request of trace ``trace_id`` (and parent, if any)."""
        from opentelemetry.trace import SpanKind

        sampled = self.provider.sampler.should_sample(context, trace_id, name, SpanKind[kind])
        if not sampled.decision.is_sampled():  # type: ignore[no-untyped-call]
            return None
        return Sampled(trace_id, parent_ctx, sampled.trace_state, sampled.attributes)

    def export(
        self,
        name: str,
        kind: str,
        trace: RequestTrace,
        end: float,
        error: str | None,
        serialized: float | None = None,
    ) -> None:
        """The request's SERVER span (``name``, child of its caller's span) and everything
        its road recorded, below it. ``serialized``: when the answer was encoded (the front
        end's parse and serialize spans lie around the servables').

        The spans are finished when they are made (their times were recorded on the road):
        each is one plain record (``span_export.Record``) handed to the exporting child,
        which makes the SDK's spans of them; nothing of the SDK is made here."""
        decision = trace.sampled
        trace_id, parent = decision.trace_id, decision.parent
        state = decision.trace_state.to_header() if decision.trace_state else ""
        new_id = self._ids.generate_span_id
        ns = self._ns
        root_id = new_id()
        attributes = {**trace.attributes, **(decision.attributes or {})}
        parent_id, remote = (parent.span_id, bool(parent.is_remote)) if parent is not None else (0, False)
        code, desc = (_ERROR, error) if error is not None else (_UNSET, None)
        kind_value = _KINDS[kind]
        records: list[Record] = [
            (
                name,
                trace_id,
                root_id,
                parent_id,
                remote,
                kind_value,
                ns(trace.start),
                ns(end),
                attributes,
                code,
                desc,
                state,
            )
        ]
        if trace.first is not None and trace.last is not None:
            records.append(
                (
                    "parse",
                    trace_id,
                    new_id(),
                    root_id,
                    False,
                    _INTERNAL,
                    ns(trace.start),
                    ns(trace.first),
                    None,
                    _UNSET,
                    None,
                    state,
                )
            )
            done = serialized if serialized is not None else end
            if done > trace.last:
                records.append(
                    (
                        "serialize",
                        trace_id,
                        new_id(),
                        root_id,
                        False,
                        _INTERNAL,
                        ns(trace.last),
                        ns(done),
                        None,
                        _UNSET,
                        None,
                        state,
                    )
                )
        made: list[tuple[int, float]] = []  # (span id, end) of each recorded span
        for span_name, start, stop, above, attrs in trace.log.spans:
            up, limit = (root_id, end) if above < 0 else made[above]
            stop = limit if stop is None else stop
            own = new_id()
            failed = attrs is not None and "error.type" in attrs
            code, desc = (_ERROR, str(attrs.get("error", ""))) if failed else (_UNSET, None)
            records.append(
                (
                    span_name,
                    trace_id,
                    own,
                    up,
                    False,
                    _INTERNAL,
                    ns(start),
                    ns(stop),
                    attrs,
                    code,
                    desc,
                    state,
                )
            )
            made.append((own, stop))
        self.pipe.add(records)

    # ---- front ends ----
    def http(self, app: HttpApplication) -> TracedHttp:
        return TracedHttp(app, self)

    def grpc_unary(
        self, method: str, handler: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        """``handler`` (a unary method of the gRPC service) with a SERVER span per call."""
        service, _, rpc = method.rpartition("/")

        async def traced(req: Any, ctx: Any) -> Any:
            start = time.perf_counter()
            decision = self.decide(method, "SERVER", _carrier(_metadata(ctx)))
            if decision is None:
                return await handler(req, ctx)
            trace = RequestTrace(start, decision)
            trace.attributes.update({"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc})
            token = CURRENT_TRACE.set(trace)
            code, error = "OK", None
            try:
                return await handler(req, ctx)
            except BaseException as exc:
                code = status_of(exc).grpc if isinstance(exc, Exception) else "CANCELLED"
                error = str(exc) if code in _GRPC_ERRORS else None
                raise
            finally:
                CURRENT_TRACE.reset(token)
                trace.attributes["rpc.grpc.status_code"] = _GRPC_CODES.get(code, 2)
                self.export(method, "SERVER", trace, time.perf_counter(), error)

        return traced


def _carrier(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """What the W3C propagator reads of a request's headers or metadata."""
    return {k.lower(): v for k, v in pairs if k.lower() in _PROPAGATED}


# OpenTelemetry's SpanKind and StatusCode values, as the records carry them
_KINDS = {"INTERNAL": 0, "SERVER": 1, "CLIENT": 2, "PRODUCER": 3, "CONSUMER": 4}
_INTERNAL = _KINDS["INTERNAL"]
_UNSET, _ERROR = 0, 2


def _env_ms(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


_TRACE_ID_LIMIT = (1 << 64) - 1  # TraceIdRatioBased compares the trace id's low 64 bits


def _sampler(ratio: float) -> tuple[Any, Any]:
    """OTEL_TRACES_SAMPLER's sampler when it is set (None: the SDK reads it), else the
    caller's decision, and ``ratio`` of the requests that bring none; and that ratio's own
    sampler (None with OTEL_TRACES_SAMPLER)."""
    if os.environ.get("OTEL_TRACES_SAMPLER"):
        return None, None
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    root = TraceIdRatioBased(ratio)
    return ParentBased(root), root


def _metadata(ctx: Any) -> Iterable[tuple[str, str]]:
    try:
        return [
            (str(k), v if isinstance(v, str) else v.decode("latin-1")) for k, v in ctx.invocation_metadata()
        ]
    except Exception:  # a context without metadata: no parent to follow
        return []


# the scope's key for the sampler's decision, taken by the express lane before the road
_DECISION = "milliserve.trace_decision"
# the express lane's answer: (status, body, headers), now or later in the loop's turn
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]] | Soon[tuple[int, bytes, list[tuple[bytes, bytes]]]]


class HttpApplication(Protocol):
    """What is traced: an ASGI application with an express lane (``HttpApp``)."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None: ...

    def express(self, scope: Scope, body: bytes) -> Answer | None: ...


class TracedHttp:
    """The HTTP application with a SERVER span per request (OpenTelemetry's HTTP semantic
    conventions: ``METHOD /route``, method, path, route, status code)."""

    def __init__(self, app: HttpApplication, tracing: Tracing) -> None:
        self.app, self.tracing = app, tracing

    def express(self, scope: Scope, body: bytes) -> Answer | None:
        """The application's express lane for a request the sampler leaves out; a sampled
        one takes the road, which records its spans (the decision is kept in the scope, so
        that the road does not sample it again)."""
        decision = scope[_DECISION] = self._decide(scope)
        return self.app.express(scope, body) if decision is None else None

    def _decide(self, scope: Scope) -> Sampled | None:
        method, path = scope.get("method", ""), scope.get("path", "")
        route = _route(path)
        name = f"{method} {route}" if route else method
        # the header names are lowercase bytes already: only the propagated ones are decoded
        carrier = {
            k.decode(): v.decode("latin-1") for k, v in scope.get("headers", ()) if k in _PROPAGATED_BYTES
        }
        return self.tracing.decide(name, "SERVER", carrier)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        decision = scope[_DECISION] if _DECISION in scope else self._decide(scope)
        if decision is None:
            await self.app(scope, receive, send)
            return
        trace = RequestTrace(start, decision)
        status = 0
        answered: float | None = None

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], time.perf_counter()
            await send(message)

        token = CURRENT_TRACE.set(trace)
        error: str | None = None
        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            status, error = status or 500, repr(exc)
            raise
        finally:
            CURRENT_TRACE.reset(token)
            self._export(scope, trace, status, answered, error)

    def _export(
        self, scope: Scope, trace: RequestTrace, status: int, answered: float | None, error: str | None
    ) -> None:
        method = scope.get("method", "")
        path = scope.get("path", "")
        route = _route(path) if status != 404 else None
        attributes = trace.attributes
        attributes.update(
            {"http.request.method": method, "url.path": path, "url.scheme": scope.get("scheme", "http")}
        )
        if route is not None:
            attributes["http.route"] = route
        if status:
            attributes["http.response.status_code"] = status
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        attributes["network.protocol.version"] = scope.get("http_version", "1.1")
        if status >= 500 and error is None:
            error = f"HTTP {status}"
        name = f"{method} {route}" if route else method
        self.tracing.export(name, "SERVER", trace, time.perf_counter(), error, answered)
