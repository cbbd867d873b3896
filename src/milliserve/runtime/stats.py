"""Per-version statistics in Triton's shape (``GET /v2/models/{m}/stats``, gRPC
``ModelStatistics``), kept together with the Prometheus children so that one
call records both."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from milliserve.observability.metrics import ModelMetrics

__all__ = ["Duration", "ModelStats"]


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class _BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStats:
    """Counters and durations of one model version."""

    def __init__(self, name: str, version: str, metrics: ModelMetrics) -> None:
        self.name = name
        self.version = version
        self.metrics = metrics
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.batches: dict[int, _BatchStat] = {}
        self.load_s = 0.0
        self.warmup_s = 0.0
        self.first_request_s: float | None = None

    def record_load(self, load_s: float, warmup_s: float) -> None:
        self.load_s, self.warmup_s = load_s, warmup_s
        self.metrics.load_duration.set(load_s)
        self.metrics.warmup_duration.set(warmup_s)

    def record_request(self, duration_ns: int, failure_reason: str | None) -> None:
        if failure_reason is None:
            self.success.add(duration_ns)
            self.metrics.success.inc()
            self.metrics.request_duration.observe(duration_ns / 1e9)
            if self.first_request_s is None:
                self.first_request_s = duration_ns / 1e9
                self.metrics.first_request.set(self.first_request_s)
        else:
            self.fail.add(duration_ns)
            self.metrics.failure(failure_reason)

    def record_batch(
        self, items: int, queue_ns: list[int], input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        m = self.metrics
        self.inference_count += items
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)  # wall clock: Triton reports epoch ms
        for q in queue_ns:
            self.queue.add(q)
            m.queue_duration.observe(q / 1e9)
        n = len(queue_ns)
        # Triton attributes batch compute time to every request in the batch.
        self.compute_input.add(input_ns * n, n)
        self.compute_infer.add(infer_ns * n, n)
        self.compute_output.add(output_ns * n, n)
        b = self.batches.get(items)
        if b is None:
            b = self.batches[items] = _BatchStat()
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)
        m.inference_count.inc(items)
        m.exec_count.inc()
        m.batch_size.observe(items)
        m.compute_input.observe(input_ns / 1e9)
        m.compute_infer.observe(infer_ns / 1e9)
        m.compute_output.observe(output_ns / 1e9)

    def as_dict(self) -> dict[str, Any]:
        """Triton's JSON statistics for this version."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": Duration().as_dict(),
                "cache_miss": Duration().as_dict(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.as_dict(),
                    "compute_infer": b.compute_infer.as_dict(),
                    "compute_output": b.compute_output.as_dict(),
                }
                for size, b in sorted(self.batches.items())
            ],
        }
