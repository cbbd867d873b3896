"""Tracing's parts without a collector: the settings (off by default, OpenTelemetry's
variables), the span log the road records, route names; and the one branch a request
without a trace pays."""

from __future__ import annotations

import asyncio

import pytest

from milliserve.config.settings import Settings, TracingSettings
from milliserve.observability.tracing import _route
from milliserve.protocol.types import InferRequest
from milliserve.road import Call, SpanLog, build_road


def test_off_by_default_and_on_from_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    assert Settings().tracing.traces_url() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "svc")
    s = Settings().tracing
    assert (s.traces_url(), s.service_name) == ("http://127.0.0.1:4318/v1/traces", "svc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/custom")
    assert Settings().tracing.traces_url() == "http://127.0.0.1:9/custom"  # taken as it is
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert Settings().tracing.traces_url() is None
    flag = TracingSettings(otlp_endpoint="http://127.0.0.1:4318/v1/traces", traces_endpoint=None)
    assert flag.traces_url() == "http://127.0.0.1:4318/v1/traces"
    with pytest.raises(ValueError, match="http:// or https://"):
        TracingSettings(otlp_endpoint="127.0.0.1:4318")


def test_span_log_nests_and_absorbs() -> None:
    log = SpanLog()
    outer = log.open("model m", 1.0)
    log.add("parse", 1.0, 1.1)
    log.close(outer, 2.0, {"k": 1})
    child = SpanLog()
    child.add("queue", 1.2, 1.3)
    step = log.open("step 1", 1.1)
    log.absorb(child)
    log.close(step, 1.5)
    assert [(s[0], s[3]) for s in log.spans] == [("model m", -1), ("parse", 0), ("step 1", -1), ("queue", 2)]
    assert log.spans[0][2] == 2.0 and log.spans[0][4] == {"k": 1} and log.parent == -1


def test_route_names_are_bounded() -> None:
    assert _route("/v2/models/fraud_mlp/infer") == "/v2/models/{model_name}/infer"
    assert _route("/v2/models/m/versions/3/infer") == "/v2/models/{model_name}/versions/{model_version}/infer"
    assert _route("/v1/chat/completions") == "/v1/chat/completions"
    assert _route("/v1/models/abc") == "/v1/models/{model}"
    assert _route("/random/path") is None


class _Stage:
    stage = "parse"

    async def run(self, call: Call) -> None:
        pass


async def _terminal(call: Call) -> list[object]:
    await asyncio.sleep(0.004)  # a batcher's queue and run, timed by the terminal itself
    call.stages["queue"] = 0.001
    call.stages["infer"] = 0.002
    return []


def test_traced_road_records_what_the_plain_road_times() -> None:
    road = build_road([_Stage()], _terminal)  # type: ignore[list-item,arg-type]
    plain = Call(InferRequest("m", "", []))
    asyncio.run(road(plain))
    assert set(plain.stages) == {"parse", "queue", "infer"} and plain.request.trace is None
    traced = Call(InferRequest("m", "", [], trace=SpanLog()))
    asyncio.run(road.traced(traced))
    assert set(traced.stages) == set(plain.stages)
    names = [s[0] for s in traced.request.trace.spans]
    assert names == ["parse", "queue", "infer"]
    queue, infer = traced.request.trace.spans[1], traced.request.trace.spans[2]
    assert queue[2] <= infer[1] + 1e-9 and infer[2] - infer[1] == pytest.approx(0.002, abs=1e-6)


def test_the_samplers_shortcut_decides_as_the_sampler_does() -> None:
    """A request without a parent is decided by its trace id alone, before any of the SDK's
    objects (``Tracing.decide``): the same decision as ParentBased(TraceIdRatioBased) takes,
    on the same trace ids; a parent's decision is still the SDK's."""
    import random

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace import SpanKind

    from milliserve.observability.tracing import Tracing

    tracing = Tracing("http://127.0.0.1:9/v1/traces", sample_ratio=0.25)
    try:
        rng = random.Random(7)
        ids = [rng.getrandbits(128) for _ in range(4000)]
        feed = iter(ids)
        tracing._ids.generate_trace_id = lambda: next(feed)  # type: ignore[method-assign]
        reference = ParentBased(TraceIdRatioBased(0.25))
        ours = [tracing.decide("POST /v2/models/{model_name}/infer", "SERVER", {}) for _ in ids]
        theirs = [reference.should_sample(None, t, "x", SpanKind.SERVER).decision.is_sampled() for t in ids]
        assert [d is not None for d in ours] == theirs
        assert 800 < sum(theirs) < 1200
        assert all(d.trace_id == t for d, t in zip(ours, ids, strict=True) if d is not None)
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # sampled by its caller
        followed = tracing.decide("x", "SERVER", {"traceparent": parent})
        assert followed is not None and followed.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    finally:
        tracing.shutdown()
