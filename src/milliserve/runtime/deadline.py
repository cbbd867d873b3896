"""Deadline admission: an online estimate of how long a request will take (queue plus
compute, per batch size), so a request that cannot finish in time is refused at once
instead of being computed for nobody."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["LatencyEstimator", "request_deadline"]

_ALPHA = 0.2  # EWMA weight of a new observation


class LatencyEstimator:
    """EWMA of the time from an instance taking a batch to its result being back on the
    event loop, per batch size; ``prior_s`` (the load-time probe) until a size is seen."""

    def __init__(self, prior_s: float | None = None) -> None:
        self.prior_s = prior_s
        self.by_batch: dict[int, float] = {}

    def observe(self, batch_size: int, seconds: float) -> None:
        old = self.by_batch.get(batch_size)
        self.by_batch[batch_size] = seconds if old is None else old + _ALPHA * (seconds - old)

    def compute_s(self, batch_size: int) -> float | None:
        """The estimate for ``batch_size``: seen exactly, else the nearest size seen, scaled
        up (never down) for a larger batch; None when nothing is known."""
        if batch_size in self.by_batch:
            return self.by_batch[batch_size]
        if not self.by_batch:
            return self.prior_s
        nearest = min(self.by_batch, key=lambda b: abs(b - batch_size))
        scale = max(1.0, batch_size / nearest)
        return self.by_batch[nearest] * scale

    def needed_s(
        self, batch_size: int, queued_items: int, free_instances: int, instances: int, max_batch: int
    ) -> tuple[float, float] | None:
        """(queue, compute) seconds a new request needs, or None when nothing is known yet.
        Under load it rides in a batch with those queued with it, not alone."""
        joined = min(max_batch, queued_items % max_batch + batch_size) if queued_items else batch_size
        compute = self.compute_s(joined)
        if compute is None:
            return None
        return self.queue_s(queued_items, free_instances, instances, max_batch), compute

    def queue_s(self, queued_items: int, free_instances: int, instances: int, max_batch: int) -> float:
        """Expected wait for an instance, on the pessimistic side (admission protects a p99):
        nothing when one is free and nobody is queued; otherwise a whole running batch plus
        the full batches queued ahead, per instance."""
        if free_instances and not queued_items:
            return 0.0
        per_batch = self.compute_s(max(1, min(max_batch, queued_items + 1))) or 0.0
        waves = math.floor(queued_items / max(1, max_batch)) / max(1, instances)
        return (0.0 if free_instances else per_batch) + waves * per_batch


def request_deadline(
    deadline: float | None, parameters: dict[str, Any], start: float, budget_s: float | None, delay: bool
) -> float | None:
    """The earliest of the request's deadline (header or gRPC), its OIP ``timeout`` (µs), and,
    when it gives neither, the budget's p99. With timeout_action DELAY (``delay``) a late
    request is still served, so its timeout is no deadline."""
    timeout = parameters.get("timeout") if parameters else None
    if timeout is None:  # the common case, kept cheap: it runs on every request
        if deadline is not None:
            return deadline
        return start + budget_s if budget_s is not None else None
    found = [deadline] if deadline is not None else []
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0 and not delay:
        found.append(start + timeout / 1e6)
    if not found and budget_s is not None:
        found.append(start + budget_s)
    return min(found) if found else None
