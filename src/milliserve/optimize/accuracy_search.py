"""Accuracy-aware INT8: the smallest set of nodes to keep in FP32 that brings the metric
back within tolerance, found by measuring, not by guessing.

1. **Rank** the candidate nodes by the damage each does when it is the only node
   quantized: the mean squared difference of the model's outputs from FP32's on a slice
   of EVAL (smooth, so it separates nodes that a 0/1 accuracy on a few rows cannot).
   Ranking stops at half the time budget; nodes not reached keep the prior order (the
   activation-outlier heuristic) after the measured ones.
2. **Restore** the worst nodes in growing prefixes (1, 2, 4, ...) until the full metric
   is within tolerance, then bisect between the last failure and the first success.

Every build and score is a ``SearchStep`` with its cost, so the report shows what the
search tried. Each search has its own deadline and gives up cleanly when it passes:
the best prefix found so far (if any) is still a variant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from milliserve.optimize.measure import EvalSet, ModelRef, predict
from milliserve.optimize.progress import Progress
from milliserve.optimize.variant import Scorer, SearchStep

__all__ = ["SearchResult", "damage_on", "restore_search"]

# (nodes kept in FP32, or None: quantize only ``only``) -> a model file
Build = Callable[[list[str], str | None], Path]


@dataclass
class SearchResult:
    kept: list[str] | None  # None: nothing within tolerance was found in the budget
    path: Path | None
    quality: float
    steps: list[SearchStep] = field(default_factory=list)
    ranked: int = 0  # nodes whose damage was measured (the rest kept the prior order)
    candidates: int = 0


def damage_on(data: EvalSet, reference: np.ndarray, threads: int = 1) -> Callable[[Path | ModelRef], float]:
    """Mean squared difference from the FP32 outputs on ``data`` (lower is better)."""

    expected = reference.astype(np.float64)

    def damage(model: Path | ModelRef) -> float:
        out = predict(model, data, threads).astype(np.float64)
        return float(np.mean((out - expected) ** 2))

    return damage


def restore_search(
    build: Build,
    nodes: list[str],
    score: Scorer,
    damage: Callable[[Path | ModelRef], float],
    target: float,
    budget_s: float,
    progress: Progress,
    label: str,
) -> SearchResult:
    """Search as the module docstring says. ``nodes`` come in prior order (worst first)."""
    start = time.monotonic()
    deadline = start + budget_s
    steps: list[SearchStep] = []
    result = SearchResult(None, None, float("-inf"), steps, candidates=len(nodes))
    if not nodes:
        return result
    damage_of: dict[str, float] = {}
    with progress.steps(f"{label}: measuring each node's damage", len(nodes)) as advance:
        for node in nodes:
            if time.monotonic() > start + budget_s / 2:
                break
            t0 = time.monotonic()
            damage_of[node] = damage(build([], node))
            advance(1)
            steps.append(
                SearchStep(
                    f"quantize only {node}: output MSE {damage_of[node]:.3g}",
                    0,
                    float("nan"),
                    time.monotonic() - t0,
                )
            )
    result.ranked = len(damage_of)
    ranked = sorted(damage_of, key=lambda n: -damage_of[n]) + [n for n in nodes if n not in damage_of]

    def attempt(k: int) -> bool:
        t0 = time.monotonic()
        path = build(ranked[:k], None)
        quality = score(path)
        steps.append(SearchStep(f"keep the {k} worst in FP32", k, quality, time.monotonic() - t0))
        if quality >= target and (result.kept is None or k < len(result.kept)):
            result.kept, result.path, result.quality = ranked[:k], path, quality
        return quality >= target

    # growing prefixes 1, 2, 4, ... then bisect between the last failure and the first success
    low, k = 0, 1
    with progress.steps(
        f"{label}: restoring nodes to FP32", max(1, int(np.log2(len(nodes))) * 2 + 1)
    ) as advance:
        while time.monotonic() < deadline:
            ok = attempt(k)
            advance(1)
            if ok or k == len(ranked):
                break
            low, k = k, min(2 * k, len(ranked))
        high = k if result.kept is not None else None
        while high is not None and high - low > 1 and time.monotonic() < deadline:
            mid = (low + high) // 2
            if attempt(mid):
                high = mid
            else:
                low = mid
            advance(1)
    return result
