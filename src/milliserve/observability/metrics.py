"""Prometheus metrics, built on a registry passed in (never the global one), so
that tests and several servers in one process never collide.

The request path records plain numbers in runtime/stats.py; this collector turns
them into metric families when the endpoint is scraped. Durations are
histograms in seconds. Counters mirror Triton's: ``inference_count`` counts
inferences (batch items) and ``exec_count`` backend executions, so their ratio
is the mean batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from milliserve.runtime.stats import HistogramData, ModelStats

__all__ = ["Metrics"]

_P = "milliserve_"
_MV = ["model", "version"]


def _buckets(h: HistogramData) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(h.bounds, h.counts, strict=False):
        running += count
        out.append((repr(float(bound)), running))
    out.append(("+Inf", running + h.counts[-1]))
    return out


class Metrics(Collector):
    """Exposes the statistics of every loaded model version on ``registry``."""

    def __init__(self, registry: CollectorRegistry, source: Callable[[], Iterable[ModelStats]]) -> None:
        self.registry = registry
        self._source = source
        registry.register(self)

    def describe(self) -> list[Metric]:
        return []  # families are dynamic; nothing to check for collisions at register time

    def collect(self) -> Iterator[Metric]:
        stats = list(self._source())
        success = CounterMetricFamily(_P + "inference_request_success", "Successful requests", labels=_MV)
        failure = CounterMetricFamily(
            _P + "inference_request_failure", "Failed requests by reason", labels=[*_MV, "reason"]
        )
        count = CounterMetricFamily(_P + "inference_count", "Inferences performed (batch items)", labels=_MV)
        execs = CounterMetricFamily(_P + "inference_exec_count", "Backend executions (batches)", labels=_MV)
        pending = GaugeMetricFamily(_P + "pending_request_count", "Requests queued or running", labels=_MV)
        load = GaugeMetricFamily(_P + "model_load_duration_seconds", "Time to load the model", labels=_MV)
        warmup = GaugeMetricFamily(_P + "model_warmup_duration_seconds", "Time spent in warmup", labels=_MV)
        first = GaugeMetricFamily(
            _P + "model_first_request_duration_seconds",
            "Latency of the first request after load (cold start)",
            labels=_MV,
        )
        hists = {
            "request_duration_seconds": ("End-to-end request time inside the server", "request_hist"),
            "queue_duration_seconds": ("Time requests waited in the batcher queue", "queue_hist"),
            "compute_input_duration_seconds": ("Time to assemble batch inputs", "compute_input_hist"),
            "compute_infer_duration_seconds": (
                "Time the backend spent running a batch",
                "compute_infer_hist",
            ),
            "compute_output_duration_seconds": ("Time to split batch outputs", "compute_output_hist"),
            "batch_size": ("Items per executed batch", "batch_hist"),
        }
        families = {
            name: HistogramMetricFamily(_P + name, doc, labels=_MV) for name, (doc, _) in hists.items()
        }
        hits = CounterMetricFamily(_P + "cache_hits", "Requests answered by the response cache", labels=_MV)
        misses = CounterMetricFamily(_P + "cache_misses", "Response cache lookups that missed", labels=_MV)
        cache_errors = CounterMetricFamily(
            _P + "cache_errors",
            "Response cache backend failures (bypassed, never failing the request), by reason",
            labels=[*_MV, "reason"],
        )
        cache_hist = {
            "hit": HistogramMetricFamily(
                _P + "cache_hit_duration_seconds", "Time to answer a request from the cache", labels=_MV
            ),
            "miss": HistogramMetricFamily(
                _P + "cache_miss_duration_seconds",
                "Time for a cache miss: lookup, compute and store",
                labels=_MV,
            ),
        }
        stage = HistogramMetricFamily(
            _P + "stage_duration_seconds",
            "Time each request spent per stage (parse, cache, queue, infer, serialize, ...)",
            labels=[*_MV, "stage"],
        )
        cap = GaugeMetricFamily(
            _P + "batcher_max_batch_size", "Batch cap chosen by budget-driven batching", labels=_MV
        )
        delay = GaugeMetricFamily(
            _P + "batcher_queue_delay_seconds", "Queue delay chosen by budget-driven batching", labels=_MV
        )
        for s in stats:
            lv = [s.name, s.version]
            if s.batching is not None:
                c, d = s.batching()
                cap.add_metric(lv, c)
                delay.add_metric(lv, d)
            for name, sh in sorted(s.stage_hist.items()):
                stage.add_metric([*lv, name], _buckets(sh), sh.sum)
            if s.cache_enabled:
                hits.add_metric(lv, s.cache_hit.count)
                misses.add_metric(lv, s.cache_miss.count)
                for reason, n in sorted(s.cache_errors().items()):
                    cache_errors.add_metric([*lv, reason], n)
                cache_hist["hit"].add_metric(lv, _buckets(s.cache_hit_hist), s.cache_hit_hist.sum)
                cache_hist["miss"].add_metric(lv, _buckets(s.cache_miss_hist), s.cache_miss_hist.sum)
            success.add_metric(lv, s.success.count)
            for reason, n in sorted(s.failures.items()):
                failure.add_metric([*lv, reason], n)
            count.add_metric(lv, s.inference_count)
            execs.add_metric(lv, s.execution_count)
            pending.add_metric(lv, s.pending())
            load.add_metric(lv, s.load_s)
            warmup.add_metric(lv, s.warmup_s)
            if s.first_request_s is not None:
                first.add_metric(lv, s.first_request_s)
            for name, (_, attr) in hists.items():
                h: HistogramData = getattr(s, attr)
                families[name].add_metric(lv, _buckets(h), h.sum)
        yield from (success, failure, count, execs, pending, load, warmup, first, *families.values())
        yield from (hits, misses, cache_errors, *cache_hist.values(), stage, cap, delay)
