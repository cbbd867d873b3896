"""When a request would get its first token, before it is admitted: the sum that
admission's ``budget { ttft_ms }`` is checked against (llm/generative_servable.py), made
from a snapshot of the engine's queue and batch (``Engine.estimate``) and the step costs
it has learned (llm/costs.py); llm/calibration.py corrects it by the error of earlier ones.

Only the requests it would wait behind count (llm.admission: higher levels, and turns with
the other clients), net of the prefix cache, and the step in flight (half of it, on
average). When every slot is taken and no preemption would give it one, a slot frees when
the soonest running sequence ends, expected after the usual output length (learned from
finished requests) or its ``max_tokens``, whichever is first.
"""

from __future__ import annotations

from collections.abc import Callable

from milliserve.llm.calibration import IDLE, QUEUED, SLOT
from milliserve.llm.costs import StepCosts
from milliserve.llm.sequence import GenRequest, Sequence
from milliserve.llm.step_plan import StepBudget

__all__ = ["first_token_wait"]


def first_token_wait(
    prompt_tokens: int,
    running: list[Sequence],
    queued: list[GenRequest],
    max_sequences: int,
    preempts: bool,
    mean_output: float,
    costs: StepCosts,
    budget: StepBudget,
    cached: Callable[[list[int]], int],
) -> tuple[float, int]:
    """The seconds until the first token of a request of ``prompt_tokens`` (after prefix
    reuse) that waits behind ``queued`` (in arrival order) beside the ``running`` batch,
    and its case (IDLE, SLOT or QUEUED: llm/calibration.py). ``preempts``: it would take a
    running sequence's slot rather than wait for one; ``cached``: prompt tokens whose KV a
    request could reuse now."""
    ahead = sum(len(r.prompt) - (cached(r.prompt) if i < 8 else 0) for i, r in enumerate(queued))
    ahead += sum(len(s.req.prompt) - s.prefilled for s in running)
    decoding = sum(1 for s in running if s.prefilled == len(s.req.prompt))
    wait = 0.0
    short = len(running) + len(queued) + 1 - max_sequences
    if short > 0 and preempts:
        short = 0
    if running:  # the step in flight ends first
        wait += 0.5 * costs.step(len(running))
    if short > 0:  # a slot must free first: the short-th soonest finisher, among the
        # running sequences and the requests ahead that take the slots still free
        typical = mean_output
        free = max(0, max_sequences - len(running))
        left = sorted(
            [max(1.0, min(s.req.max_tokens, typical) - s.generated) for s in running]
            + [min(r.max_tokens, typical) for r in queued[:free]]
        )
        busy = min(max_sequences, len(running) + len(queued))
        wait += left[min(short, len(left)) - 1] * costs.step(busy) if left else 0.0
    tokens = ahead + prompt_tokens
    steps = -(-tokens // max(1, budget.prefill(decoding)))
    raw = wait + steps * costs.step(decoding) + tokens * costs.prefill_token_s
    return raw, QUEUED if short > 0 else SLOT if running or queued else IDLE
