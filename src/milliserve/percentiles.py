"""The one way milliserve computes a percentile of samples: the load generator, the
optimizer's timings, cold start, hedging's rolling p95 and every benchmark script call
:func:`percentile` or :func:`percentiles`, so that a p99 means the same thing wherever it
is printed.

The convention is the **nearest rank** (numpy's ``method="inverted_cdf"`` but for its
floating-point slips, which put 99.9% of 1000 samples at the 1000th; HdrHistogram's
``getValueAtPercentile`` and perf_analyzer use the same rule): the p-th percentile of n
samples is the smallest sample such that at least p% of the samples are at or below it,
i.e. the ``ceil(p / 100 * n)``-th smallest (the smallest sample for p = 0). It is always a
value that was measured, never an interpolation between two: with 100 samples the p99 is
the 99th smallest, and with fewer than 100 it is the largest. p = 100 is the maximum.

Prometheus histograms are the one thing estimated otherwise: from bucket counts, inside a
bucket, as Prometheus' ``histogram_quantile`` does (``milliserve.budget.stage_report``), because
the samples themselves are gone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["percentile", "percentiles"]


def percentiles(values: Iterable[float] | np.ndarray[Any, Any], ps: Sequence[float]) -> list[float]:
    """The nearest-rank percentiles ``ps`` (each 0 to 100) of ``values``, in the order of
    ``ps``. Raises ValueError when there are no values, or a p outside 0..100."""
    data = np.sort(np.asarray(values if isinstance(values, np.ndarray) else list(values), np.float64).ravel())
    if not data.size:
        raise ValueError("a percentile of no values: there are no samples")
    out = []
    for p in ps:
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile {p} is outside 0..100")
        # rounded first: 99.9 / 100 * 1000 is 999.0000000000001 in floating point, rank 999
        rank = math.ceil(round(p * data.size / 100.0, 9))
        out.append(float(data[max(rank, 1) - 1]))
    return out


def percentile(values: Iterable[float] | np.ndarray[Any, Any], p: float) -> float:
    """The nearest-rank p-th percentile (0 to 100) of ``values`` (see the module's
    docstring). Raises ValueError when there are no values, or p is outside 0..100."""
    return percentiles(values, [p])[0]
