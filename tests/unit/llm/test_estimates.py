"""The engine's cost estimates (admission by TTFT estimate reads them) against a machine
that stalls a step now and then: one stalled step must not make honest requests look
seconds over budget, and a machine that stays slower must still be learned. The estimate's
calibration by observed first tokens, and which client may claim a slot from another."""

from __future__ import annotations

from milliserve.llm.admission import fair_claim
from milliserve.llm.calibration import IDLE, QUEUED, RATE, SLOT, TtftCalibration
from milliserve.llm.costs import OUTLIER, StepCosts, toward


def test_one_stalled_step_moves_the_estimate_a_bounded_amount() -> None:
    est = 0.003  # seconds per prompt token
    stalled = toward(est, 0.060)  # one 16-token prefill slowed by a second
    assert stalled <= est * (0.8 + 0.2 * OUTLIER) + 1e-12
    for _ in range(10):  # ordinary steps again
        stalled = toward(stalled, 0.003)
    assert abs(stalled - est) < 0.001


def test_a_machine_that_stays_slower_is_learned() -> None:
    est = 0.003
    for _ in range(30):
        est = toward(est, 0.030)
    assert abs(est - 0.030) < 0.001


def test_an_estimate_of_zero_can_still_grow() -> None:
    assert toward(0.0, 0.004) > 0.0


def _costs_at_8_streams() -> StepCosts:
    costs = StepCosts()
    costs.seed(one=0.010, four=0.022, prompt32=0.035)  # about 0.8 ms a prompt token
    for _ in range(40):
        costs.learn(0.040, logits=8, prompt_tokens=0, drafted=0)  # 8 streams decoding
    return costs


def test_a_prompt_token_costs_what_its_step_took_beyond_a_decode_step_of_its_size() -> None:
    """A prompt chunk joining 8 decoding streams: the step took 40 ms of decoding and 16 x
    0.8 ms of prompt. Measured against the one-token step (10 ms) a prompt token had been
    learned as 2.7 ms, and admission by estimate refused honest requests at half load."""
    costs = _costs_at_8_streams()
    for _ in range(40):
        costs.learn(0.040 + 16 * 0.0008, logits=8, prompt_tokens=16, drafted=0)
    assert abs(costs.prefill_token_s - 0.0008) < 0.0001


def test_a_draft_costs_what_it_added_to_the_decode_step_it_rode_in() -> None:
    costs = _costs_at_8_streams()
    for _ in range(40):  # 8 sequences, 2 drafts: 2 logit tokens more
        costs.learn(0.040 + 2 * 0.003, logits=10, prompt_tokens=0, drafted=2)
    assert abs(costs.draft_token_s - 0.003) < 0.0003


def test_sizes_not_seen_lie_on_a_line_through_the_learned_ones() -> None:
    costs = _costs_at_8_streams()
    assert costs.step(1) == 0.010
    assert 0.022 < costs.step(6) < 0.040  # between the warm-up's 4 and the learned 8
    assert costs.step(12) > costs.step(8)  # past the largest: the slope of the two largest
    assert costs.step(0) == costs.step(1)


def test_one_stalled_step_of_a_new_size_moves_its_estimate_a_bounded_amount() -> None:
    costs = _costs_at_8_streams()
    line = costs.step(6)
    costs.learn(1.0, logits=6, prompt_tokens=0, drafted=0)  # the machine stalled a second
    assert costs.step(6) <= line * (0.8 + 0.2 * OUTLIER) + 1e-12


def test_the_calibration_learns_the_factor_the_raw_estimate_is_off_by() -> None:
    """First tokens that come 3x later than the raw estimate, when a slot was free: after a
    few, the calibrated estimate is within a few percent of what comes; the other cases (an
    idle engine, a wait for a slot) keep their own factors."""
    cal = TtftCalibration()
    assert cal.factor(SLOT) == 1.0
    for _ in range(20):
        cal.learn(0.300, 0.100, SLOT)
    assert abs(cal.factor(SLOT) - 3.0) < 0.05
    assert cal.factor(IDLE) == cal.factor(QUEUED) == 1.0 and cal.seen(SLOT) == 20
    assert cal.factors()["slot"] == cal.factor(SLOT)


def test_one_stalled_first_token_moves_the_calibration_a_bounded_amount() -> None:
    cal = TtftCalibration()
    for _ in range(30):
        cal.learn(0.100, 0.100, QUEUED)
    cal.learn(100.0, 0.100, QUEUED)  # a stall of 100 s
    assert 1.0 < cal.factor(QUEUED) < 4.0**RATE + 1e-9
    cal.learn(0.0, 0.100, QUEUED)  # nothing to learn from
    assert cal.factor(QUEUED) < 4.0**RATE + 1e-9


def test_a_client_under_its_share_claims_a_slot_only_from_one_over_it() -> None:
    held = {"flood": 8}
    assert fair_claim("newcomer", held, {"flood"}, 8)  # share 4: the flood holds 8
    assert not fair_claim("flood", held, {"flood"}, 8)  # a client never claims from itself
    assert fair_claim("c", {"a": 4, "b": 4}, {"a", "b"}, 8)  # share 3 of three clients
    assert not fair_claim("c", {"a": 2, "b": 2}, {"a", "b"}, 8)  # nobody over: free slots
    assert not fair_claim("b", {"a": 4, "b": 4}, {"a", "b"}, 8)  # b holds its share already
