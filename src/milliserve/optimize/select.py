"""Choose the variant to ship: the fastest whose quality is within tolerance of FP32."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Candidate", "pareto_front", "select", "suggest_batching"]


@dataclass
class Candidate:
    name: str
    quality: float  # accuracy or cosine similarity: higher is better
    timing: dict[str, float]
    servable: bool = True  # milliserve serve can run it (ONNX Runtime); others are only reported

    def latency(self, key: str) -> float:
        return self.timing.get(key, float("inf"))


def select(
    candidates: list[Candidate], reference: float, tolerance: float, key: str = "p99_b1_us"
) -> Candidate | None:
    """The lowest ``key`` among candidates whose quality is at least ``reference - tolerance``."""
    ok = [c for c in candidates if c.servable and c.quality >= reference - tolerance and key in c.timing]
    return min(ok, key=lambda c: (c.latency(key), -c.quality)) if ok else None


def pareto_front(candidates: list[Candidate], key: str = "p99_b1_us") -> list[str]:
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
