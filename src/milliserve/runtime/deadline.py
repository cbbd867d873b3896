"""Deadline admission: an online estimate of how long a request will take (queue plus
compute), so a request that cannot finish in time is refused at once instead of being
computed for nobody.

The estimate must correct itself, because a refused request never runs and so never
tells the estimator it was wrong. Three things see to that:

- **size**: compute time is fitted as ``fixed + per_unit * work``, where work is the
  number of input elements of the batch (batch size times sequence length for a
  text model), so a long request is not judged by short ones;
- **decay**: observations lose half their weight every ``half_life_s``, and as they
  fade the estimate returns to the load-time probe (the prior);
- **probes**: while it refuses and the model is idle, one request per
  ``probe_interval_s`` runs anyway; an observation far faster than the estimate
  (under half of it) discounts the older ones fourfold, so a model whose slow
  period has ended is re-measured within a few probes, not a few half-lives. When
  nothing has run since the load-time probe, the model's warmup input is run in the
  background instead (``reprobe_due``), so a probe taken on a busy machine cannot
  refuse everything for good.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["LatencyEstimator", "request_deadline"]


class LatencyEstimator:
    """Seconds from an instance taking a batch to its result being back on the event loop,
    as a function of the batch's work (input elements)."""

    def __init__(
        self,
        prior_s: float | None = None,
        prior_work: float = 1.0,
        half_life_s: float = 0.5,
        capacity: float = 32.0,
        prior_weight: float = 0.5,
        probe_interval_s: float = 0.25,
    ) -> None:
        self.prior_s = prior_s
        self.prior_work = max(prior_work, 1.0)
        self.half_life_s = half_life_s
        self.capacity = capacity
        self.prior_weight = prior_weight
        self.probe_interval_s = probe_interval_s
        # decayed sums of 1, w, w², t, w·t as of time self._at
        self._s0 = self._sw = self._sww = self._st = self._swt = 0.0
        self._at = 0.0
        self.last_observed = -math.inf
        self._last_probe = -math.inf
        self.item_work = 1.0  # running mean of one item's work, to size a queued batch
        self.probes = 0
        # set by admission once a request has a deadline: until then nobody reads the
        # estimate, and requests without one pay nothing for its bookkeeping
        self.active = False

    # ---- learning ----
    def _decay_to(self, now: float) -> None:
        if self._s0 and now > self._at:
            self._scale(0.5 ** ((now - self._at) / self.half_life_s))
        self._at = now

    def _scale(self, f: float) -> None:
        self._s0 *= f
        self._sw *= f
        self._sww *= f
        self._st *= f
        self._swt *= f

    def observe(self, work: float, seconds: float, items: int = 1, now: float | None = None) -> None:
        """One executed batch of ``items`` requests and ``work`` input elements."""
        now = time.perf_counter() if now is None else now
        self._decay_to(now)
        expected = self._fit(work) if self._s0 else None
        if expected is not None and seconds < 0.5 * expected:
            self._scale(0.25)  # the world got faster than we believe: trust the old less
        self._s0 += 1.0
        self._sw += work
        self._sww += work * work
        self._st += seconds
        self._swt += work * seconds
        if self._s0 > self.capacity:
            self._scale(self.capacity / self._s0)
        self.item_work += 0.1 * (work / max(items, 1) - self.item_work)
        self.last_observed = now

    # ---- estimating ----
    def _fit(self, work: float) -> float:
        s0 = self._s0
        mw, mt = self._sw / s0, self._st / s0
        var = self._sww / s0 - mw * mw
        if var > (0.05 * mw) ** 2:
            slope = max(0.0, (self._swt / s0 - mw * mt) / var)
            fixed = mt - slope * mw
            if fixed < 0:  # the fit says nothing is fixed: proportional through the origin
                return mt * work / mw
            return fixed + slope * work
        # one size seen: scale up for more work, never down (the fixed part is unknown)
        return mt * max(1.0, work / mw) if mw > 0 else mt

    def _prior(self, work: float) -> float | None:
        if self.prior_s is None:
            return None
        return self.prior_s * max(1.0, work / self.prior_work)

    def compute_s(self, work: float, now: float | None = None) -> float | None:
        """Estimated compute for a batch of ``work``; None when nothing is known."""
        prior = self._prior(work)
        if not self._s0:
            return prior
        now = time.perf_counter() if now is None else now
        weight: float = self._s0 * 0.5 ** (max(0.0, now - self._at) / self.half_life_s)
        fitted = self._fit(work)
        if prior is None:
            return fitted
        return (weight * fitted + self.prior_weight * prior) / (weight + self.prior_weight)

    def needed_s(
        self,
        work: float,
        queued_items: int,
        free_instances: int,
        instances: int,
        max_batch: int,
        now: float | None = None,
    ) -> tuple[float, float] | None:
        """(queue, compute) seconds a new request of ``work`` needs, or None when nothing is
        known yet. Under load it rides in a batch with those queued with it, not alone."""
        riders = min(max_batch - 1, queued_items % max_batch) if queued_items else 0
        compute = self.compute_s(work + riders * self.item_work, now)
        if compute is None:
            return None
        return self.queue_s(queued_items, free_instances, instances, max_batch, now), compute

    def queue_s(
        self, queued_items: int, free_instances: int, instances: int, max_batch: int, now: float | None = None
    ) -> float:
        """Expected wait for an instance, on the pessimistic side (admission protects a p99):
        nothing when one is free and nobody is queued; otherwise a whole running batch plus
        the full batches queued ahead, per instance."""
        if free_instances and not queued_items:
            return 0.0
        batch = max(1, min(max_batch, queued_items + 1))
        per_batch = self.compute_s(batch * self.item_work, now) or 0.0
        waves = math.floor(queued_items / max(1, max_batch)) / max(1, instances)
        return (0.0 if free_instances else per_batch) + waves * per_batch

    def probe(self, idle: bool, now: float) -> bool:
        """Whether a request that would be refused should run anyway to re-measure the model:
        only when observations (not just the load-time probe) say refuse, while it is idle,
        at most once per ``probe_interval_s``, and only when nothing was observed for that long."""
        if not self._s0 or not idle or now - self.last_observed < self.probe_interval_s:
            return False
        if now - self._last_probe < self.probe_interval_s:
            return False
        self._last_probe = now
        self.probes += 1
        return True

    def reprobe_due(self, idle: bool, now: float) -> bool:
        """Whether to re-measure the model with its warmup input, in the background: the only
        estimate is the load-time probe (no request has run since), it says refuse, and the
        model is idle. A probe taken while the machine was busy would otherwise refuse every
        request for good. At most once per ``probe_interval_s``."""
        if self._s0 or not idle or now - self._last_probe < self.probe_interval_s:
            return False
        self._last_probe = now
        self.probes += 1
        return True


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
