"""The engine's cost estimates (admission by TTFT estimate reads them) against a machine
that stalls a step now and then: one stalled step must not make honest requests look
seconds over budget, and a machine that stays slower must still be learned."""

from __future__ import annotations

from milliserve.llm.engine import OUTLIER, _toward


def test_one_stalled_step_moves_the_estimate_a_bounded_amount() -> None:
    est = 0.003  # seconds per prompt token
    stalled = _toward(est, 0.060)  # one 16-token prefill slowed by a second
    assert stalled <= est * (0.8 + 0.2 * OUTLIER) + 1e-12
    for _ in range(10):  # ordinary steps again
        stalled = _toward(stalled, 0.003)
    assert abs(stalled - est) < 0.001


def test_a_machine_that_stays_slower_is_learned() -> None:
    est = 0.003
    for _ in range(30):
        est = _toward(est, 0.030)
    assert abs(est - 0.030) < 0.001


def test_an_estimate_of_zero_can_still_grow() -> None:
    assert _toward(0.0, 0.004) > 0.0
