"""Budget-driven batching: ``dynamic_batching { target_p99_ms }`` lets the batcher tune its
queue delay and batch cap online, for the most throughput whose measured queue + compute
p99 stays under the target.

A controller, every ``interval_s`` once enough requests were seen:

- over the target, it halves the queue delay, and then looks at where the time goes.
  When requests wait longer in the queue than they compute, the server is short of
  throughput and the cap grows (doubling, up to ``max_batch_size``): shrinking it
  there would cut throughput and let the queue run away, so when the target cannot
  be met at this load the controller keeps throughput rather than collapse. When the
  queue is short, one batch's compute alone takes longer than the whole target and the
  instances are busy less than half the time, batches are too big for the load: the cap
  shrinks by 30%. (Measured on MiniLM, a smaller cap at higher utilization only made
  p99 worse: the leftover requests wait a whole batch more.)
- well under the target (< 70%), it grows the cap by a quarter; and it adds a small
  step of delay (up to a quarter of the target) only while the instances are busy
  most of the time (over 80%), when a fuller batch saves compute. With idle
  instances a longer delay only adds latency, so it halves the delay instead, down to a
  short window (100 µs) in which the batcher waits only for a companion it predicts.
- in between it holds.

It starts from that short window (or the configured delay) and the full ``max_batch_size``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.batcher import Batcher

__all__ = ["AdaptiveBatching"]


class AdaptiveBatching:
    def __init__(
        self,
        batcher: Batcher,
        base: BatchPolicy,
        target_s: float,
        interval_s: float = 0.25,
        min_samples: int = 20,
        instances: int = 1,
    ) -> None:
        self.batcher = batcher
        self.base = base
        self.target_s = target_s
        self.interval_s = interval_s
        self.min_samples = min_samples
        self.cap = base.max_batch_size
        # never below a short window (100 µs, or 0.5% of a tighter target): the batcher waits
        # only when it predicts a companion within it, so it costs a lone request nothing and
        # lets concurrent arrivals share a batch
        self.min_delay_s = max(base.max_queue_delay_s, min(100e-6, target_s * 0.005))
        self.delay_s = self.min_delay_s
        self.step_s = max(50e-6, target_s * 0.02)
        self.instances = max(1, instances)
        self._busy_at = (time.perf_counter(), getattr(batcher, "busy_s", 0.0))
        self.samples: deque[float] = deque(maxlen=2000)
        self.compute: deque[float] = deque(maxlen=2000)
        self.queue: deque[float] = deque(maxlen=2000)
        self.last = time.perf_counter()
        self.adjustments = 0
        self._apply()

    def observe(self, queue_s: float, compute_s: float) -> None:
        """One request's time in the queue and from dispatch to its result."""
        self.samples.append(queue_s + compute_s)
        self.compute.append(compute_s)
        self.queue.append(queue_s)
        now = time.perf_counter()
        if now - self.last >= self.interval_s and len(self.samples) >= self.min_samples:
            self.last = now
            self._adjust()

    @staticmethod
    def _p99(values: deque[float]) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0

    def p99(self) -> float:
        return self._p99(self.samples)

    def utilization(self) -> float:
        """The share of instance time spent running batches since the last adjustment."""
        now, busy = time.perf_counter(), getattr(self.batcher, "busy_s", 0.0)
        then, was = self._busy_at
        self._busy_at = (now, busy)
        return (busy - was) / max(1e-9, (now - then) * self.instances)

    def _shorter_delay(self) -> None:
        self.delay_s = max(self.min_delay_s, self.delay_s * 0.5)

    def _adjust(self) -> None:
        p99 = self.p99()
        busy = self.utilization()
        if p99 > self.target_s:
            self._shorter_delay()
            queue, compute = self._p99(self.queue), self._p99(self.compute)
            if queue > compute:
                self.cap = min(self.base.max_batch_size, self.cap * 2)  # queueing: more throughput
            elif compute > self.target_s and busy < 0.5:
                # one batch alone eats the budget, and there is capacity to spare for smaller
                # ones; at higher utilization a smaller cap would cost the throughput that keeps
                # the queue short, and a target out of reach is best served at full throughput
                self.cap = max(1, int(self.cap * 0.7))
        elif p99 < 0.7 * self.target_s:
            self.cap = min(self.base.max_batch_size, self.cap + max(1, self.cap // 4))
            if busy > 0.8:  # nearly saturated: fuller batches save compute
                self.delay_s = min(self.delay_s + self.step_s, 0.25 * self.target_s)
            else:  # idle time to spare: waiting only adds latency
                self._shorter_delay()
        else:
            return
        self.samples.clear()  # judge the new setting on its own requests
        self.compute.clear()
        self.queue.clear()
        self.adjustments += 1
        self._apply()

    def _apply(self) -> None:
        preferred = tuple(p for p in self.base.preferred_batch_sizes if p <= self.cap)
        self.batcher.policy = dataclasses.replace(
            self.base,
            max_batch_size=self.cap,
            max_queue_delay_s=self.delay_s,
            preferred_batch_sizes=preferred,
        )
