"""What a generation step costs, learned from the steps the engine runs.

A step's time depends most on how many of its tokens want logits (each decoding sequence's
next token and its drafts, the last token of a prompt that finishes): a step of 8 decoding
sequences takes about four times a one-token step here. One decode-step estimate, learned
from whatever steps ran last, made every other figure wrong: a prompt token's cost was
measured against a one-token step while the step it joined held 8 sequences, so the 8-stream
step's own time was charged to the prompt's tokens (it stood at 4.9 ms a token in an open
loop), and admission by TTFT estimate refused requests at half load that would have been on
time.

So steps without a prompt chunk are kept by their number of logit tokens (drafts count:
verifying them is the same work as as many more sequences' tokens), and a prompt token costs
what its step took beyond the decode step of the same size.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["OUTLIER", "StepCosts", "toward"]

# A step the machine slowed (the engine thread descheduled, a burst of other work) moves an
# estimate by at most this many times its value before the average: one 16-token prefill
# stalled for a second had made a prompt token cost 60 ms instead of 3, and admission
# refused a 20-token prompt beside two streams as "about 5 s" over its TTFT budget. A
# machine that stays slower still moves the estimate there, by up to 1.4x a step.
OUTLIER = 3.0


def toward(old: float, sample: float) -> float:
    """The estimate ``old`` after one more measurement ``sample`` (an EWMA of samples
    clipped at OUTLIER times the estimate, floored at 0.1 ms so a zero can still grow)."""
    return 0.8 * old + 0.2 * min(sample, OUTLIER * max(old, 1e-4))


class StepCosts:
    """Seconds of a decode-only step by its logit tokens, seconds per prompt token and per
    drafted token on top of the decode step they ride in. Seeded by the engine's warm-up
    (``seed``), then moved by every step (``learn``)."""

    def __init__(self) -> None:
        self._decode: dict[int, float] = {1: 0.02}  # logit tokens -> seconds of the step
        self.prefill_token_s = 0.003
        self.draft_token_s = 0.004  # what a drafted token adds to a small step

    def seed(self, one: float, four: float, prompt32: float, eight: float | None = None) -> None:
        """The warm-up's one-token step, a step of 4 logit tokens, a 32-token prompt (one
        logit token), and a step of 8 logit tokens if measured."""
        self._decode = {1: one, 4: max(four, one)}
        if eight is not None:
            self._decode[8] = max(eight, four, one)
        self.prefill_token_s = max(0.0, prompt32 - one) / 31
        # 0 on a busy machine (the one-token steps slowed, this one not): the engine reads it
        # as cheap, and the steps that verify drafts correct it
        self.draft_token_s = max(0.0, four - one) / 3

    def step(self, logits: int) -> float:
        """Seconds of a decode-only step of ``logits`` tokens: the learned figure for that
        size, else a line through the nearest learned sizes (past the largest, the slope of
        the two largest, never below flat)."""
        n = max(1, logits)
        d = self._decode
        if n in d:
            return d[n]
        sizes = sorted(d)
        below = [k for k in sizes if k < n]
        above = [k for k in sizes if k > n]
        if not below:
            return d[above[0]]
        lo = below[-1]
        if above:
            hi = above[0]
            return d[lo] + (d[hi] - d[lo]) * (n - lo) / (hi - lo)
        if len(below) == 1:  # one size known: a token more costs what a draft does
            return d[lo] + (n - lo) * self.draft_token_s
        prev = below[-2]
        slope = max(0.0, (d[lo] - d[prev]) / (lo - prev))
        return d[lo] + slope * (n - lo)

    def learn(self, dt: float, logits: int, prompt_tokens: int, drafted: int) -> None:
        """One step of ``dt`` seconds: ``logits`` tokens wanted logits (drafts included),
        ``prompt_tokens`` more did not."""
        if prompt_tokens == 0 and drafted:
            base = self.step(logits - drafted)
            self.draft_token_s = toward(self.draft_token_s, max(0.0, dt - base) / drafted)
        if prompt_tokens == 0:
            # a size seen for the first time starts from the line through its neighbours,
            # so that one stalled step cannot set it
            self._decode[logits] = toward(self.step(logits), dt)
        elif prompt_tokens >= 16:
            per = max(0.0, dt - self.step(logits)) / prompt_tokens
            self.prefill_token_s = toward(self.prefill_token_s, per)

    def drafts_worth(self, chances: Sequence[float], expect: float, width: int) -> int:
        """Drafts worth verifying (up to ``len(chances)``) for a sequence whose i-th drafted
        token is accepted with chance ``chances[i]`` if the ones before it are, in a step of
        ``width`` logit tokens so far that is expected to yield ``expect`` tokens: the count
        d that makes the step yield the most tokens a second, (expect + c0 + c0 c1 + ... +
        c0 ... c(d-1)) / step(width + d), none where no count beats the step without. A
        step's cost does not grow in a line: on 2 vCPU a one-token step took 8.4 ms, two
        tokens 15.7, four 23.8, eleven 50.3. So one or two drafts cost most per token, and a
        copy accepted 90% of the time pays from three on, not one at a time."""
        best, best_rate = 0, expect / max(self.step(width), 1e-6)
        gain, q = expect, 1.0
        for d, c in enumerate(chances, 1):
            q *= min(max(c, 0.0), 0.99)
            gain += q
            rate = gain / max(self.step(width + d), 1e-6)
            if rate > best_rate:
                best, best_rate = d, rate
        return best
