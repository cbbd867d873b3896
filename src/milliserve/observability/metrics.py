"""Prometheus metrics. Every family is built on a registry passed in, never the
global one, so that tests and several servers in one process never collide.

Durations are histograms in seconds (Prometheus base units). Counters mirror
Triton's: ``inference_count`` counts inferences (batch items) and
``exec_count`` counts backend executions, so their ratio is the mean batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["LATENCY_BUCKETS", "Metrics", "ModelMetrics"]

LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_MV = ("model", "version")


@dataclass(slots=True)
class ModelMetrics:
    """Label-bound children for one model version (binding once keeps the hot path cheap)."""

    success: Counter
    inference_count: Counter
    exec_count: Counter
    request_duration: Histogram
    queue_duration: Histogram
    compute_input: Histogram
    compute_infer: Histogram
    compute_output: Histogram
    batch_size: Histogram
    pending: Gauge
    load_duration: Gauge
    warmup_duration: Gauge
    first_request: Gauge
    _failure: Counter
    _labels: tuple[str, str]

    def failure(self, reason: str) -> None:
        self._failure.labels(*self._labels, reason).inc()


class Metrics:
    """All metric families of one server."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        p = "milliserve_"

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(p + name, doc, _MV, buckets=LATENCY_BUCKETS, registry=registry)

        self._success = Counter(
            p + "inference_request_success", "Successful requests", _MV, registry=registry
        )
        self._failure = Counter(
            p + "inference_request_failure", "Failed requests by reason", (*_MV, "reason"), registry=registry
        )
        self._count = Counter(
            p + "inference_count", "Inferences performed (batch items)", _MV, registry=registry
        )
        self._exec = Counter(
            p + "inference_exec_count", "Backend executions (batches)", _MV, registry=registry
        )
        self._request = hist("request_duration_seconds", "End-to-end request time inside the server")
        self._queue = hist("queue_duration_seconds", "Time requests waited in the batcher queue")
        self._cin = hist("compute_input_duration_seconds", "Time to assemble batch inputs")
        self._cinfer = hist("compute_infer_duration_seconds", "Time the backend spent running a batch")
        self._cout = hist("compute_output_duration_seconds", "Time to split batch outputs")
        self._batch = Histogram(
            p + "batch_size", "Items per executed batch", _MV, buckets=BATCH_BUCKETS, registry=registry
        )
        self._pending = Gauge(
            p + "pending_request_count", "Requests queued or running", _MV, registry=registry
        )
        self._load = Gauge(
            p + "model_load_duration_seconds", "Time to load the model", _MV, registry=registry
        )
        self._warmup = Gauge(
            p + "model_warmup_duration_seconds", "Time spent in warmup", _MV, registry=registry
        )
        self._first = Gauge(
            p + "model_first_request_duration_seconds",
            "Latency of the first request after load (cold start)",
            _MV,
            registry=registry,
        )

    def bind(self, model: str, version: str) -> ModelMetrics:
        lv = (model, version)
        return ModelMetrics(
            success=self._success.labels(*lv),
            inference_count=self._count.labels(*lv),
            exec_count=self._exec.labels(*lv),
            request_duration=self._request.labels(*lv),
            queue_duration=self._queue.labels(*lv),
            compute_input=self._cin.labels(*lv),
            compute_infer=self._cinfer.labels(*lv),
            compute_output=self._cout.labels(*lv),
            batch_size=self._batch.labels(*lv),
            pending=self._pending.labels(*lv),
            load_duration=self._load.labels(*lv),
            warmup_duration=self._warmup.labels(*lv),
            first_request=self._first.labels(*lv),
            _failure=self._failure,
            _labels=lv,
        )
