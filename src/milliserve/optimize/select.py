"""Choose the variant to ship: the fastest whose quality is within tolerance of FP32,
and only when its speed-up over FP32 is larger than the measurement noise.

Latency is ranked on a robust statistic (p50 by default); a p99 key is honoured only
when every candidate has enough samples for its 99th percentile to mean something.
Each speed-up carries a 95% bootstrap interval over the interleaved timing rounds:
rounds are resampled together for both variants, so a burst of load on the machine
moves both sides of the ratio and drops out, while a difference that only exists in
some rounds widens the interval. A winner must have its interval's lower end above
``1 + min_gain``; otherwise FP32 (or the ONNX Runtime-optimised FP32 graph) ships and
the report says why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.percentiles import percentile, percentiles

__all__ = [
    "Candidate",
    "Selection",
    "latency_parts",
    "pareto_front",
    "select",
    "speedup_interval",
    "suggest_batching",
]

BASELINE = "fp32"
MIN_P99_SAMPLES = 1000  # below this, a p99 is the 10th-largest of too few calls
_KEY = re.compile(r"^p(50|90|95|99)_b(\d+)_us$")

Rounds = Sequence[Sequence[float]]  # seconds per call, one list per interleaved round


@dataclass
class Candidate:
    name: str
    quality: float  # accuracy or cosine similarity: higher is better
    timing: dict[str, float]
    servable: bool = True  # milliserve serve can run it; reference rows (torch.compile) cannot
    rounds: dict[int, Rounds] = field(default_factory=dict)  # batch -> per-round samples

    def latency(self, key: str) -> float:
        return self.timing.get(key, float("inf"))


@dataclass
class Selection:
    winner: Candidate | None
    key: str  # the latency key actually ranked on
    reason: str  # one sentence for the report: why this one, or why FP32
    intervals: dict[str, tuple[float, float, float]] = field(default_factory=dict)


def latency_parts(key: str) -> tuple[float, int]:
    """``p50_b1_us`` -> (50.0, 1). Raises ValueError for a key that names no percentile."""
    m = _KEY.match(key)
    if m is None:
        raise ValueError(f"latency key {key!r}: expected p50|p90|p95|p99 _b<batch>_us, e.g. p50_b1_us")
    return float(m.group(1)), int(m.group(2))


def speedup_interval(
    base: Rounds, other: Rounds, q: float = 50.0, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(point, low, high): base's q-th percentile over other's, with a 95% bootstrap
    interval that resamples whole rounds, paired (round i of both sides moves together)."""
    n = min(len(base), len(other))
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    b = [np.asarray(r, dtype=np.float64) for r in base[:n]]
    o = [np.asarray(r, dtype=np.float64) for r in other[:n]]
    point = percentile(np.concatenate(b), q) / percentile(np.concatenate(o), q)
    if n < 3:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    for i in range(resamples):
        idx = rng.integers(0, n, n)
        ratios[i] = percentile(np.concatenate([b[j] for j in idx]), q) / percentile(
            np.concatenate([o[j] for j in idx]), q
        )
    low, high = percentiles(ratios, [2.5, 97.5])
    return point, float(low), float(high)


def _usable_key(candidates: list[Candidate], key: str) -> tuple[str, str]:
    q, batch = latency_parts(key)
    if q <= 50:
        return key, ""
    fewest = min((sum(len(r) for r in c.rounds.get(batch, ())) for c in candidates), default=0)
    if fewest >= MIN_P99_SAMPLES:
        return key, ""
    fallback = f"p50_b{batch}_us"
    return fallback, (
        f"ranked on {fallback}, not {key}: the smallest candidate has {fewest} timed calls at batch "
        f"{batch}, fewer than the {MIN_P99_SAMPLES} a p{q:.0f} needs (raise --rounds)"
    )


def select(
    candidates: list[Candidate],
    reference: float,
    tolerance: float,
    key: str = "p50_b1_us",
    min_gain: float = 0.02,
) -> Selection:
    """The fastest servable candidate within ``tolerance`` of ``reference`` whose speed-up
    over FP32 has a 95% interval above ``1 + min_gain``; else the FP32 fallback, with why.

    Candidates without per-round samples (no FP32 baseline to compare with) are ranked on
    ``key`` alone, as a last resort."""
    key, note = _usable_key(candidates, key)
    q, batch = latency_parts(key)
    ok = [c for c in candidates if c.servable and c.quality >= reference - tolerance and key in c.timing]
    if not ok:
        return Selection(None, key, f"no servable variant kept quality within {tolerance} of FP32")
    base = next((c for c in candidates if c.name == BASELINE and c.rounds.get(batch)), None)
    if base is None:
        best = min(ok, key=lambda c: (c.latency(key), -c.quality))
        return Selection(best, key, _join(note, f"{best.name}: fastest on {key} (FP32 was not timed)"))
    intervals = {c.name: speedup_interval(base.rounds[batch], c.rounds.get(batch, ()), q) for c in candidates}
    proven = [c for c in ok if c.name != BASELINE and intervals[c.name][1] > 1 + min_gain]
    if proven:
        best = max(proven, key=lambda c: intervals[c.name][0])
        p, lo, hi = intervals[best.name]
        why = f"{best.name}: {p:.2f}× FP32 on {key} (95% CI {lo:.2f}–{hi:.2f}), quality within {tolerance}"
        return Selection(best, key, _join(note, why), intervals)
    optimized = next((c for c in ok if c.name == "ort_optimized"), None)
    # the offline-optimised FP32 graph ships when it is at least not slower; else FP32 itself
    fallback = optimized if optimized is not None and intervals[optimized.name][0] >= 1.0 else base
    fastest = max((c for c in ok if c.name != BASELINE), key=lambda c: intervals[c.name][0], default=None)
    doubt = ""
    if fastest is not None:
        p, lo, hi = intervals[fastest.name]
        doubt = f" (closest: {fastest.name} at {p:.2f}×, 95% CI {lo:.2f}–{hi:.2f})"
    why = (
        f"{fallback.name}: no variant within tolerance was faster than FP32 by more than "
        f"{min_gain:.0%} beyond its measured spread{doubt}"
    )
    return Selection(fallback, key, _join(note, why), intervals)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def pareto_front(candidates: list[Candidate], key: str = "p50_b1_us") -> list[str]:
    """Names of candidates that no other beats on both latency and quality."""
    front = []
    for c in candidates:
        dominated = any(
            o is not c
            and o.latency(key) <= c.latency(key)
            and o.quality >= c.quality
            and (o.latency(key) < c.latency(key) or o.quality > c.quality)
            for o in candidates
        )
        if not dominated:
            front.append(c.name)
    return front


def suggest_batching(timing: dict[str, Any]) -> dict[str, Any]:
    """A dynamic-batching suggestion from the measured batch curve: prefer the smallest
    batch whose per-item time is within 20% of the best, and wait at most half its run."""
    per_item = {b: timing[f"p50_b{b}_us"] / b for b in (1, 8, 32) if f"p50_b{b}_us" in timing}
    if not per_item:
        return {}
    best = min(per_item.values())
    preferred = min(b for b, t in per_item.items() if t <= 1.2 * best)
    delay = int(timing.get(f"p50_b{preferred}_us", 100) / 2)
    return {"preferred_batch_size": [preferred], "max_queue_delay_microseconds": max(delay, 50)}
