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

from milliserve.runtime.stats import GenerationStats, HistogramData, ModelStats

__all__ = ["Metrics"]

_P = "milliserve_"
_MV = ["model", "version"]
# counters kept by pipeline steps (pipeline/hedge.py, pipeline/cascade.py), per step
STEP_COUNTERS = {
    "hedges_sent": "Extra copies of a request a hedged step sent to another replica",
    "hedges_won": "Requests of a hedged step answered first by an extra copy",
    "hedges_suppressed": "Hedges a step did not send: the replica's queue or the step's in-flight "
    "requests were over their limit",
    "cascade_fast_rows": "Rows a cascade step answered from its fast model",
    "cascade_escalated_rows": "Rows a cascade step escalated to its full model",
    "cascade_escalations_skipped": "Rows a cascade step answered from its fast model because the full "
    "model would have missed the request's deadline",
}


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
        hedge_lost = CounterMetricFamily(
            _P + "inference_hedge_lost",
            "Requests a hedged pipeline step cancelled because another replica answered first (not failures)",
            labels=_MV,
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
            if s.hedges_lost:
                hedge_lost.add_metric(lv, s.hedges_lost)
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
        yield from (
            success,
            failure,
            hedge_lost,
            count,
            execs,
            pending,
            load,
            warmup,
            first,
            *families.values(),
        )
        yield from (hits, misses, cache_errors, *cache_hist.values(), stage, cap, delay)
        yield from _steps([s for s in stats if s.step_counts])
        yield from _generation([s for s in stats if s.generation is not None])


def _steps(stats: list[ModelStats]) -> Iterator[Metric]:
    """Pipelines: what their steps count (``milliserve_pipeline_hedges_sent_total``, ...)."""
    if not stats:
        return
    fam = {
        n: CounterMetricFamily(_P + "pipeline_" + n, doc, labels=[*_MV, "step"])
        for n, doc in STEP_COUNTERS.items()
    }
    for s in stats:
        for step, counts in s.step_counts.items():
            for n, value in counts.items():
                if n in fam:
                    fam[n].add_metric([s.name, s.version, step], value)
    yield from (f for f in fam.values() if f.samples)


def _generation(stats: list[ModelStats]) -> Iterator[Metric]:
    """Generative models: time to first token, between tokens, end to end, queue; tokens in
    and out; running and waiting sequences; KV use; speculative drafts and acceptance."""
    if not stats:
        return
    hists = {
        "ttft_seconds": ("Time from arrival to the first generated token", "ttft_hist"),
        "cold_ttft_seconds": (
            "Time from arrival to the first token of requests whose model was loaded for them "
            "(llm_memory_mib; the load included)",
            "cold_ttft_hist",
        ),
        "itl_seconds": ("Time between generated tokens (inter-token latency)", "itl_hist"),
        "e2e_seconds": ("Time from arrival to the last token", "e2e_hist"),
        "queue_seconds": ("Time a generation waited for a sequence slot", "queue_hist"),
        "request_prompt_tokens": ("Prompt tokens per request", "prompt_tokens_hist"),
        "request_output_tokens": ("Generated tokens per request", "output_tokens_hist"),
        "ttft_estimate_ratio": (
            "Time to first token over what admission estimated for it (calibrated)",
            "ttft_ratio_hist",
        ),
    }
    fam = {n: HistogramMetricFamily(_P + "generation_" + n, doc, labels=_MV) for n, (doc, _) in hists.items()}
    counters = {
        "prompt_tokens": "Prompt tokens received",
        "output_tokens": "Tokens generated",
        "cached_prompt_tokens": "Prompt tokens whose KV came from a cache (kept, prefix or host)",
        "host_cache_hits": "Prompts whose beginning's KV was restored from host memory (prompt_cache_mib)",
        "refused_budget": "Requests refused because their first token would miss budget.ttft_ms",
        "refused_share": "Requests refused because their client already had its share of the queue",
        "preempted": "Sequences suspended (KV to host memory) so that another client's could run",
        "interrupted": "Steps stopped in flight for a priority prompt, or for a burst's next prompt to join",
        "draft_tokens": "Tokens drafted for speculative decoding",
        "accepted_tokens": "Drafted tokens the model accepted",
        "recalled_tokens": "Of the drafted tokens, those drafted from earlier answers (draft_memory_tokens)",
        "recalled_accepted_tokens": "Tokens drafted from earlier answers that the model accepted",
        "steps": "Engine steps (one llama_decode each)",
    }
    cfam = {n: CounterMetricFamily(_P + "generation_" + n, doc, labels=_MV) for n, doc in counters.items()}
    finished = CounterMetricFamily(
        _P + "generation_finished",
        "Finished generations by reason (stop, length, abort, error, refused: evicted from the queue "
        "for another client's request)",
        labels=[*_MV, "reason"],
    )
    running = GaugeMetricFamily(_P + "generation_running", "Sequences being generated", labels=_MV)
    waiting = GaugeMetricFamily(_P + "generation_waiting", "Requests waiting for a sequence", labels=_MV)
    suspended = GaugeMetricFamily(
        _P + "generation_suspended", "Sequences suspended by preemption, waiting to resume", labels=_MV
    )
    kv = GaugeMetricFamily(
        _P + "generation_kv_tokens", "KV cache cells held by running sequences", labels=_MV
    )
    host = GaugeMetricFamily(
        _P + "generation_host_cache_bytes", "Host memory holding saved prompt KV", labels=_MV
    )
    kv_cap = GaugeMetricFamily(
        _P + "generation_kv_capacity_tokens", "KV cache cells for sequences", labels=_MV
    )
    resident = GaugeMetricFamily(
        _P + "generation_resident_bytes",
        "Resident memory its load added, as measured when it loaded on demand (llm_memory_mib)",
        labels=_MV,
    )
    calib = GaugeMetricFamily(
        _P + "generation_ttft_calibration",
        "Factor applied to the raw TTFT estimate, learned from observed first tokens, by case "
        "(idle: an idle engine; slot: a free slot beside running sequences; queued: a wait for one)",
        labels=[*_MV, "case"],
    )
    accept = GaugeMetricFamily(
        _P + "generation_speculative_acceptance", "Accepted / drafted tokens since load", labels=_MV
    )
    for s in stats:
        g: GenerationStats | None = s.generation
        assert g is not None
        lv = [s.name, s.version]
        for n, (_, attr) in hists.items():
            h: HistogramData = getattr(g, attr)
            fam[n].add_metric(lv, _buckets(h), h.sum)
        for n in counters:
            cfam[n].add_metric(lv, getattr(g, n))
        for reason, k in sorted(g.finished.items()):
            finished.add_metric([*lv, reason], k)
        running.add_metric(lv, g.running())
        waiting.add_metric(lv, g.waiting())
        suspended.add_metric(lv, g.suspended())
        kv.add_metric(lv, g.kv_tokens())
        kv_cap.add_metric(lv, g.kv_capacity)
        host.add_metric(lv, g.host_cache_bytes())
        accept.add_metric(lv, g.accepted_tokens / g.draft_tokens if g.draft_tokens else 0.0)
        if g.resident_bytes:
            resident.add_metric(lv, g.resident_bytes)
        for case, factor in sorted(g.ttft_calibration().items()):
            calib.add_metric([*lv, case], factor)
    yield from (*fam.values(), *cfam.values(), finished, running, waiting, suspended)
    yield from (kv, kv_cap, host, accept, calib, resident)
