"""The time-to-first-token estimate, calibrated against the first tokens that came.

The engine's estimate (``Engine.estimate``) is built from what steps cost (llm/costs.py)
and what is ahead of a request. What it leaves out (the event loop's own latency, a
machine whose other work stalls a step, the wait for a slot that the usual output
length predicts badly) makes it err by a factor that changes with the load. Each first
token teaches the factor: the running mean of log(observed / estimated) of recent
requests, kept apart for three cases whose errors differ (on a loaded 2-vCPU machine,
a request on an idle engine came in half its raw estimate while one beside running
streams came later than its own): an idle engine (``IDLE``), a free slot beside running
sequences (``SLOT``), and a wait for a slot to free (``QUEUED``: its error is mostly the
output length of the requests it waits for). The estimate used for admission is the raw
one times its case's factor; what that estimate erred by is the metric
``milliserve_generation_ttft_estimate_ratio`` (observed over estimated).

``factor`` is read on the event loop, ``learn`` runs on the engine thread: floats,
written by one thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CASES", "IDLE", "QUEUED", "SLOT", "Estimate", "TtftCalibration"]

IDLE, SLOT, QUEUED = 0, 1, 2
CASES = ("idle", "slot", "queued")  # the metric's labels, by case
# one first token moves the factor by this share of its error (in log space) once warm
RATE = 0.1
# an observation counts as at most 4x off either way: a first token that a stall of the
# machine held up for seconds moves the factor by at most 4**RATE (1.15x)
CLAMP = math.log(4.0)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A request's expected time to first token at admission."""

    seconds: float  # calibrated: what admission compares with the budget
    raw: float  # from the step costs alone
    case: int  # IDLE, SLOT or QUEUED

    @property
    def queues(self) -> bool:
        """No free slot (nor preemption) takes it: it waits for one to free."""
        return self.case == QUEUED


class TtftCalibration:
    """A running factor per case, learned from observed TTFTs."""

    __slots__ = ("_log", "_seen")

    def __init__(self) -> None:
        self._log = [0.0] * len(CASES)
        self._seen = [0] * len(CASES)

    def factor(self, case: int) -> float:
        return math.exp(self._log[case])

    def factors(self) -> dict[str, float]:
        return {name: math.exp(v) for name, v in zip(CASES, self._log, strict=True)}

    def seen(self, case: int) -> int:
        return self._seen[case]

    def learn(self, observed_s: float, raw_s: float, case: int) -> None:
        """A first token came ``observed_s`` after its request arrived; its raw estimate
        was ``raw_s``. The first few set the factor (their mean), later ones move it."""
        if observed_s <= 0.0 or raw_s <= 0.0:
            return
        err = max(-CLAMP, min(CLAMP, math.log(observed_s / raw_s)))
        self._seen[case] += 1
        rate = max(RATE, 1.0 / self._seen[case])
        self._log[case] += rate * (err - self._log[case])
