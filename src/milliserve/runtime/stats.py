"""Per-version statistics, recorded with plain Python arithmetic on the request path.

One record feeds both views: Triton's statistics (``GET /v2/models/{m}/stats``,
gRPC ``ModelStatistics``) and the Prometheus metrics, which a collector reads
only when the metrics endpoint is scraped (observability/metrics.py). Keeping
prometheus_client's locks off the hot path saves ~10 µs per request.
All recording happens on the event loop thread.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BATCH_BUCKETS",
    "LATENCY_BUCKETS",
    "Duration",
    "GenerationStats",
    "HistogramData",
    "ModelStats",
    "merge_statistics",
]

LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
# stages are often a few microseconds: finer at the bottom than request latencies
STAGE_BUCKETS = (
    0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class HistogramData:
    """A histogram's state: counts per bucket (not cumulative; the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


@dataclass(slots=True)
class _BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


def _latency() -> HistogramData:
    return HistogramData(LATENCY_BUCKETS)


TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)
# observed / estimated time to first token (llm/calibration.py)
RATIO_BUCKETS = (0.25, 0.5, 0.667, 0.8, 1.0, 1.25, 1.5, 2.0, 4.0)


@dataclass(slots=True)
class GenerationStats:
    """What a generative model records besides requests: the engine thread writes the
    counters and histograms (single writer; a scrape reads them as they are), and
    ``running``/``waiting``/``kv`` are read from the engine when scraped."""

    ttft_hist: HistogramData = field(default_factory=_latency)
    # first tokens of requests whose model was loaded for them (llm_memory_mib), load included
    cold_ttft_hist: HistogramData = field(default_factory=_latency)
    itl_hist: HistogramData = field(default_factory=_latency)
    e2e_hist: HistogramData = field(default_factory=_latency)
    queue_hist: HistogramData = field(default_factory=_latency)
    prompt_tokens_hist: HistogramData = field(default_factory=lambda: HistogramData(TOKEN_BUCKETS))
    output_tokens_hist: HistogramData = field(default_factory=lambda: HistogramData(TOKEN_BUCKETS))
    # each first token's TTFT over what admission estimated for it (llm/calibration.py)
    ttft_ratio_hist: HistogramData = field(default_factory=lambda: HistogramData(RATIO_BUCKETS))
    # the estimate's calibration factors, by case (idle, slot, queued: llm/calibration.py)
    ttft_calibration: Callable[[], dict[str, float]] = dict
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    host_cache_hits: int = 0  # prompts whose beginning was restored from host memory
    host_cache_bytes: Callable[[], int] = lambda: 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason (stop, length, abort, ...)
    refused_budget: int = 0
    refused_share: int = 0  # refused because their client's queue was over its share
    preempted: int = 0  # sequences suspended so that another could run (llm.admission)
    interrupted: int = 0  # steps stopped in flight for a higher-priority prompt, or for a burst to join
    suspended: Callable[[], int] = lambda: 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    recalled_tokens: int = 0  # of draft_tokens, those drafted from earlier answers
    recalled_accepted_tokens: int = 0
    steps: int = 0
    running: Callable[[], int] = lambda: 0
    waiting: Callable[[], int] = lambda: 0
    kv_tokens: Callable[[], int] = lambda: 0
    kv_capacity: int = 0
    # what loading it added to the process's resident memory (loaded on demand; 0: not measured)
    resident_bytes: int = 0

    # recorded by the engine thread (llm/engine.py), the single writer
    def admitted(self, prompt_tokens: int, cached: int, queued_s: float) -> None:
        """A request took a slot after ``queued_s``, ``cached`` of its prompt's tokens reused."""
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached
        self.prompt_tokens_hist.observe(prompt_tokens)
        self.queue_hist.observe(queued_s)

    def first_token(self, ttft_s: float, cold: bool) -> None:
        """A first token, ``ttft_s`` after its request arrived; ``cold``: its model was loaded
        for it (a cold start, counted apart)."""
        (self.cold_ttft_hist if cold else self.ttft_hist).observe(ttft_s)

    def next_tokens(self, gap_s: float, n: int) -> None:
        """``n`` more tokens of a stream, ``gap_s`` apart on average."""
        for _ in range(n):
            self.itl_hist.observe(gap_s)

    def ended(self, reason: str) -> None:
        """A request ended for ``reason`` (stop, length, abort, refused, error)."""
        self.finished[reason] = self.finished.get(reason, 0) + 1


@dataclass(slots=True)
class ModelStats:
    """Counters and durations of one model version."""

    name: str
    version: str
    pending: Callable[[], int] = lambda: 0
    queued: Callable[[], int] = lambda: 0  # of pending, those waiting for an instance
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    failures: dict[str, int] = field(default_factory=dict)
    # copies sent by a hedged pipeline step that another replica beat, cancelled: not failures
    hedges_lost: int = 0
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, _BatchStat] = field(default_factory=dict)
    request_hist: HistogramData = field(default_factory=_latency)
    queue_hist: HistogramData = field(default_factory=_latency)
    compute_input_hist: HistogramData = field(default_factory=_latency)
    compute_infer_hist: HistogramData = field(default_factory=_latency)
    compute_output_hist: HistogramData = field(default_factory=_latency)
    batch_hist: HistogramData = field(default_factory=lambda: HistogramData(BATCH_BUCKETS))
    # response cache (when enabled): Triton's cache_hit / cache_miss, plus errors by reason
    cache_enabled: bool = False
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    cache_hit_hist: HistogramData = field(default_factory=_latency)
    cache_miss_hist: HistogramData = field(default_factory=_latency)
    cache_errors: Callable[[], dict[str, int]] = dict
    # per-stage durations of successful requests (parse, cache, queue, infer, serialize, ...)
    stage_hist: dict[str, HistogramData] = field(default_factory=dict)
    # budget-driven batching: the current (batch cap, queue delay in s), when it is on
    batching: Callable[[], tuple[int, float]] | None = None
    # pipelines: counters kept by steps (hedges, cascade rows), by step name then counter
    step_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    # generative models only
    generation: GenerationStats | None = None
    load_s: float = 0.0
    warmup_s: float = 0.0
    first_request_s: float | None = None

    def record_load(self, load_s: float, warmup_s: float) -> None:
        self.load_s, self.warmup_s = load_s, warmup_s

    def record_request(self, duration_ns: int, failure_reason: str | None) -> None:
        if failure_reason is None:
            self.success.add(duration_ns)
            self.request_hist.observe(duration_ns / 1e9)
            if self.first_request_s is None:
                self.first_request_s = duration_ns / 1e9
        else:
            self.fail.add(duration_ns)
            self.failures[failure_reason] = self.failures.get(failure_reason, 0) + 1

    def record_stages(self, stages: dict[str, float]) -> None:
        # on every request: observe() inlined, names looked up once
        hists = self.stage_hist
        for name, seconds in stages.items():
            h = hists.get(name)
            if h is None:
                h = hists[name] = HistogramData(STAGE_BUCKETS)
            h.counts[bisect_left(STAGE_BUCKETS, seconds)] += 1
            h.sum += seconds

    def record_alone(self, duration_ns: int, infer_ns: int) -> None:
        """A successful request that ran alone, at once, with nothing to assemble or split
        (the express lane): what ``record_batch(1, [0], 0, infer_ns, 0)`` and
        ``record_request(duration_ns, None)`` record, in a few operations (it runs on every
        such request)."""
        self.inference_count += 1
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        self.queue.count += 1
        self.queue_hist.counts[0] += 1  # a zero wait, in the first bucket
        self.compute_input.count += 1
        self.compute_input_hist.counts[0] += 1
        self.compute_output.count += 1
        self.compute_output_hist.counts[0] += 1
        c = self.compute_infer
        c.count += 1
        c.ns += infer_ns
        infer_s = infer_ns / 1e9
        h = self.compute_infer_hist
        h.counts[bisect_left(LATENCY_BUCKETS, infer_s)] += 1
        h.sum += infer_s
        b = self.batches.get(1)
        if b is None:
            b = self.batches[1] = _BatchStat()
        b.compute_input.count += 1
        b.compute_output.count += 1
        c = b.compute_infer
        c.count += 1
        c.ns += infer_ns
        self.batch_hist.counts[0] += 1  # a batch of 1
        self.batch_hist.sum += 1
        c = self.success
        c.count += 1
        c.ns += duration_ns
        seconds = duration_ns / 1e9
        h = self.request_hist
        h.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h.sum += seconds
        if self.first_request_s is None:
            self.first_request_s = seconds

    def record_cache(self, hit: bool, duration_ns: int) -> None:
        """A cache lookup's outcome; for a miss the duration covers the compute it waited for."""
        (self.cache_hit if hit else self.cache_miss).add(duration_ns)
        (self.cache_hit_hist if hit else self.cache_miss_hist).observe(duration_ns / 1e9)

    def record_batch(
        self, items: int, queue_ns: list[int], input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        self.inference_count += items
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)  # wall clock: Triton reports epoch ms
        for q in queue_ns:
            self.queue.add(q)
            self.queue_hist.observe(q / 1e9)
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
        self.batch_hist.observe(items)
        self.compute_input_hist.observe(input_ns / 1e9)
        self.compute_infer_hist.observe(infer_ns / 1e9)
        self.compute_output_hist.observe(output_ns / 1e9)

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
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
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


_IDENTITY = frozenset(("name", "version", "batch_size"))  # what an entry is, not what it counted


def _merge(a: Any, b: Any, key: str = "") -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        for k, v in b.items():
            if k in _IDENTITY:
                merged.setdefault(k, v)
            else:
                merged[k] = _merge(merged[k], v, k) if k in merged else v
        return merged
    if isinstance(a, list) and isinstance(b, list):
        return _merge_list(a, b)
    if key == "last_inference":
        return max(a, b)
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return a + b
    return a


def _ident(item: Any) -> Any:
    if isinstance(item, dict):
        for keys in (("name", "version"), ("batch_size",)):
            if all(k in item for k in keys):
                return tuple(item[k] for k in keys)
    return None


def _merge_list(a: list[Any], b: list[Any]) -> list[Any]:
    out = list(a)
    index = {_ident(x): i for i, x in enumerate(out) if _ident(x) is not None}
    for item in b:
        ident = _ident(item)
        if ident is not None and ident in index:
            out[index[ident]] = _merge(out[index[ident]], item)
        else:
            if ident is not None:
                index[ident] = len(out)
            out.append(item)
    return out


def merge_statistics(per_worker: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Triton's model statistics of several workers as one server's: counts and
    nanoseconds summed per model version (and per batch size), the latest last_inference."""
    merged: list[dict[str, Any]] = []
    for stats in per_worker:
        merged = _merge_list(merged, stats)
    return merged
