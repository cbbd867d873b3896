"""What one engine step holds: how many drafts and prompt tokens fit beside the streams
decoding (the ITL target against the learned step costs), which prompts get chunks, and
the batch those make, in slot order (``plan_step``, the engine's third phase)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from milliserve.llm.costs import StepCosts
from milliserve.llm.drafts import Drafter, Lookup
from milliserve.llm.sequence import Sequence

__all__ = [
    "DEFAULT_ITL_S",
    "JOIN_MIN_S",
    "MIN_CHUNK",
    "Batch",
    "JoinWindow",
    "PlannedStep",
    "StepBudget",
    "build_batch",
    "plan_step",
]

# the time between tokens speculation keeps a step within when the model has no budget.itl_ms
DEFAULT_ITL_S = 0.05
# the fewest prompt tokens a step beside decoding streams prefills (StepBudget.prefill)
MIN_CHUNK = 4
# a step of prompts only may be joined by a request arriving this soon after it began, at
# least (StepCosts may take prompt tokens as free on a busy machine)
JOIN_MIN_S = 0.01


class StepBudget:
    """A step's room beside its decoding streams. ``itl_budget_s`` is the model's
    ``budget.itl_ms`` (None: DEFAULT_ITL_S, and bursts may join whole, see ``chunks``)."""

    def __init__(
        self, costs: StepCosts, step_tokens: int, itl_budget_s: float | None, draft_tokens: int
    ) -> None:
        self.costs = costs
        self.step_tokens = step_tokens
        self.itl_budget_s = itl_budget_s
        self.draft_tokens = draft_tokens

    def itl_target_s(self) -> float:
        """The ITL target: ``budget.itl_ms``, else DEFAULT_ITL_S."""
        return self.itl_budget_s if self.itl_budget_s is not None else DEFAULT_ITL_S

    def step_room_s(self, decoding: int, share: float = 0.8) -> float:
        """Seconds a step of ``decoding`` logit tokens may grow by (drafts, prompt chunks) and
        stay within ``share`` of the ITL target."""
        return self.itl_target_s() * share - self.costs.step(decoding)

    def draft_room(self, decoding: int) -> int:
        """Draft tokens one step of ``decoding`` sequences may verify: as many as keep it,
        at the learned step costs, within 80% of the ITL target, or within the whole target
        where one sequence decodes (a step that runs over then delays only that sequence's
        own tokens, and no other stream's). Unbounded, two sequences drafting 10 tokens each
        made 64 ms steps here, and every chunk gap of an open-loop run at half capacity was
        over a 60 ms ITL objective. The room was a cost per draft times a count; the first
        draft costs most (a one-token step 17 ms, two tokens 30, three 40), so a cost
        learned from one-draft steps left room for one draft where two fit."""
        limit = self.itl_target_s() * (1.0 if decoding == 1 else 0.8)
        room, most = 0, self.draft_tokens * decoding
        while room < most and self.costs.step(decoding + room + 1) <= limit:
            room += 1
        return room

    def prefill(self, decoding: int) -> int:
        """Prompt tokens a step may prefill beside ``decoding`` tokens that want logits: as
        many as keep the step within 80% of the ITL target, and at least what keeps it
        within the whole target (between MIN_CHUNK and 16), so that a prompt always moves.
        With nothing decoding there is no stream to stall. A whole chat prompt joining 8
        streams made an 80 ms gap in each of them, and an open loop at 70% of capacity lost
        requests to their ITL p99 (61-65 ms against 60). A floor of 16 tokens whatever the
        streams: beside 7 decoding streams (35 ms) a 16-token chunk made 99 ms steps, and a
        250-token prompt arriving in an open loop at half of capacity gave each of the 7
        sixteen gaps over 60 ms (their ITL objective missed) while its own first token came
        after 1.4 s all the same."""
        budget = self.step_tokens - decoding
        if decoding:
            per = max(self.costs.prefill_token_s, 1e-6)
            fit = int(self.step_room_s(decoding) / per)
            floor = min(16, max(MIN_CHUNK, int(self.step_room_s(decoding, 1.0) / per)))
            budget = min(budget, max(floor, fit))
        return max(1, budget)

    def chunks(
        self, running: list[Sequence], decoding: list[Sequence], fed: int, alone: set[int]
    ) -> dict[int, int]:
        """Prompt tokens each prefilling sequence gets this step (slot -> count), oldest
        first, beside ``decoding`` streams feeding ``fed`` tokens; with ``alone``, only
        those slots' prompts run.

        A burst joins whole: its first request started alone and the rest arrived during
        that step, so they wait beside streams one token old. Held to the ITL share (4
        tokens a step beside 2-7 streams here), 7 chats of 8 new tokens took 14 steps, their
        TTFT p99 1.1-2.0 s against llama-server's 0.5; whole, one step of 0.39 s. Those
        streams take that one long gap (once each: ``Sequence.stretched``), which a
        128-token answer's ITL p99 spares. Not under an explicit budget.itl_ms, which every
        gap keeps. A prompt arriving later beside older streams gets the ITL share, so a
        steady load is scheduled as before."""
        budget = normal = self.prefill(fed)
        if (
            decoding
            and self.itl_budget_s is None
            and all(s.generated <= 1 and not s.stretched for s in decoding)
        ):
            budget = max(budget, self.step_tokens - fed)
        chunk: dict[int, int] = {}
        for s in running:
            left = len(s.req.prompt) - s.prefilled
            if left <= 0 or budget <= 0 or (alone and s.slot not in alone):
                continue
            chunk[s.slot] = n = min(left, budget)
            budget -= n
        if sum(chunk.values()) > normal:
            for s in decoding:
                s.stretched = True
        return chunk


@dataclass
class Batch:
    """One ``llama_decode``'s entries, and what they mean for the sequences."""

    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)
    # decoding sequences: (sequence, index of its first entry, its drafts)
    plan: list[tuple[Sequence, int, list[int]]] = field(default_factory=list)
    # prefilling ones: (sequence, chunk length, index of its logits or -1)
    prefill: list[tuple[Sequence, int, int]] = field(default_factory=list)


def build_batch(
    running: list[Sequence],
    feed: dict[int, list[int]],
    drafts_of: dict[int, list[int]],
    chunk: dict[int, int],
) -> Batch:
    """The step's batch: each decoding sequence's ``feed`` (its last token and drafts),
    each prefilling one's chunk.

    With one KV buffer per sequence, llama.cpp splits a batch into micro-batches of
    sequences whose ids follow each other (0, 1, 2, ...) in batch order, each one more pass
    over the weights: the entries go in slot order, and slots are handed out lowest first,
    so that a step is one pass (two when a prompt chunk is longer)."""
    b = Batch()
    for s in sorted(running, key=lambda x: x.slot):
        if s.slot in feed:
            b.plan.append((s, len(b.tokens), drafts_of[s.slot]))
            for j, t in enumerate(feed[s.slot]):
                b.tokens.append(t)
                b.pos.append(s.n_past + j)
                b.seqs.append(s.slot)
                b.logits.append(True)
        elif s.slot in chunk:
            n = chunk[s.slot]
            done = s.prefilled + n == len(s.req.prompt)
            b.tokens.extend(s.req.prompt[s.prefilled : s.prefilled + n])
            b.pos.extend(range(s.prefilled, s.prefilled + n))
            b.seqs.extend([s.slot] * n)
            b.logits.extend([False] * n)
            if done:
                b.logits[-1] = True
            b.prefill.append((s, n, len(b.tokens) - 1 if done else -1))
    return b


class JoinWindow:
    """When a step of prompts only (a burst's first chat, started alone) may be stopped by
    a request arriving, so that the request's prompt runs with it in the step run again,
    as llama-server's loop takes a burst that arrived together in one batch. Left to run,
    the others join beside its first token, and that stream takes one long gap (the pooled
    ITL p99 of 16-token answers: 361 ms against 107).

    The window is half of what the step should take, counted from the burst's first step
    (a step stopped for a join runs again from the start), so that all the steps stopped
    waste that half at most. ``begin`` and ``end`` come from the engine thread around a
    step, ``join`` from the event loop; the lock keeps a join from stopping a later step."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._until = 0.0  # perf_counter time; 0: no step may be stopped
        self._joined = False  # the last step was stopped for a join
        self._burst_at = 0.0  # when the first of the steps stopped so began

    def begin(self, t0: float, half_s: float | None) -> None:
        """A step begins at ``t0``: of prompts only, expected to take ``2 * half_s``, or
        not joinable (None). A burst ends with the first step not stopped for a join."""
        with self._gate:
            if not self._joined:
                self._burst_at = t0
            self._joined = False
            if half_s is not None:
                self._until = self._burst_at + max(JOIN_MIN_S, half_s)

    def end(self) -> None:
        """The step in flight ended: it may not be stopped any more."""
        with self._gate:
            self._until = 0.0

    def join(self, now: float, stop: Callable[[], None]) -> None:
        """A request arrived at ``now``: stop the step in flight (``stop``) if it is in its
        window. Once per step."""
        if not self._until:
            return
        with self._gate:
            if now < self._until:
                self._until = 0.0
                self._joined = True
                stop()


@dataclass(slots=True)
class PlannedStep:
    """A planned step: its batch, the drafts' lookups by slot (to learn from), and whether
    a priority prompt runs alone in it."""

    batch: Batch
    looked: dict[int, list[Lookup]]
    alone: bool


def plan_step(
    running: list[Sequence],
    urgent: int | None,
    drafter: Drafter,
    budget: StepBudget,
    speculate_below: int,
    n_ctx: int,
) -> PlannedStep:
    """The step's batch: each decoding sequence's last token and its drafts, then prompt
    chunks. A request that stopped the last step (``urgent``,
    from submit) runs its prompt alone in this one."""
    alone = (
        set()
        if urgent is None
        else {s.slot for s in running if s.req.level <= urgent and s.prefilled < len(s.req.prompt)}
    )
    decoding = [] if alone else [s for s in running if s.prefilled == len(s.req.prompt)]
    # drafts wait while a prompt is prefilled beside them: they would take the step's room
    # that its chunks need (the prompt gets only its floor), and at 8 streams of grounded
    # prompts, starting together, speculation on made 0.93x the tokens/s of off
    prefilling = len(decoding) < len(running)
    speculate = drafter.draft_tokens > 0 and len(decoding) < speculate_below and not prefilling
    speculate = speculate and any(s.req.speculate for s in decoding)  # else no room to size
    # drafts make a step longer for every stream, accepted or not: all of a step's drafts
    # together stay within what keeps the step in the ITL target
    room = budget.draft_room(len(decoding)) if speculate else 0
    feed: dict[int, list[int]] = {}  # slot -> tokens this step (decoding: last + drafts)
    drafts_of: dict[int, list[int]] = {}
    looked: dict[int, list[Lookup]] = {}  # slot -> its lookups, to learn from
    expect, width = float(len(decoding)), len(decoding)  # tokens the step yields; its logits
    for s in decoding:
        drafts: list[int] = []
        if speculate and s.req.speculate:
            drafts, gain, looked[s.slot] = drafter.draft(s, room, expect, width, n_ctx)
            expect += gain
            width += len(drafts)
            room -= len(drafts)
        drafts_of[s.slot] = drafts
        feed[s.slot] = [s.last, *drafts]
    fed = sum(len(f) for f in feed.values())
    chunk = budget.chunks(running, decoding, fed, alone) if prefilling else {}
    return PlannedStep(build_batch(running, feed, drafts_of, chunk), looked, bool(alone))
