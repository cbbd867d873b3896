"""Speculative drafts: where a sequence's next tokens are looked up (its own tokens,
``Sequence.lookup``; the engine's earlier answers, ``llm.memory``), how likely each
lookup's tokens are to be accepted (``Acceptance``), and how many of them a step drafts
(``StepCosts.drafts_worth``). A draft is verified by the step that decodes it: the
sequence's output is the same with or without it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from milliserve.llm.costs import StepCosts
from milliserve.llm.memory import DraftMemory
from milliserve.llm.sequence import MATCH_TOKENS, Sequence
from milliserve.llm.token_model import TokenModel
from milliserve.runtime.stats import GenerationStats

__all__ = ["Acceptance", "Drafter", "Lookup", "expected"]


class Acceptance:
    """The chance that a drafted token is accepted, by how many tokens of context its
    lookup matched, learned from every sequence of the engine (one table per place drafts
    come from: a match in the sequence's own tokens and one in earlier answers are not
    equally sure).

    Drafts whose lookup matched the last 2 tokens were accepted 45-64% of the time in chats
    and grounded answers here, those whose lookup matched 12 tokens 93-97% of the time; the
    i-th token of a draft has matched i more once the ones before it are accepted. One
    acceptance rate per sequence could not tell these apart. A new sequence's rate started
    at 1, and its first short match drafted ten tokens; in a JSON list of a text's names and
    ages, lookups that came right for two or three tokens (the keys) raised the rate until
    drafts were made where the values differ, and speculation made that answer 10% slower
    than none. Chances are kept per match length as decayed counts (about the last 50
    checks weigh), starting from L/(L+1) as if two checks had been made."""

    DECAY = 0.98

    def __init__(self) -> None:
        # by match length (index; the last one stands for MATCH_TOKENS and more):
        # [accepted, checked], decayed
        self._odds = [[2 * n / (n + 1), 2.0] for n in range(MATCH_TOKENS + 1)]

    def chances(self, match: int, n: int) -> list[float]:
        """The chance of each of ``n`` drafted tokens, after a lookup that matched ``match``
        tokens, given that the ones before it are accepted."""
        odds = self._odds
        return [a / t for a, t in (odds[min(match + i, MATCH_TOKENS)] for i in range(n))]

    def learn(self, match: int, drafted: int, accepted: int) -> None:
        """A verification of ``drafted`` tokens (or, with 1, the lookup's unverified guess:
        a sequence that drafts nothing still teaches it) after a lookup that matched
        ``match``: the tokens checked are those accepted and the first one rejected."""
        k = self.DECAY
        for i in range(min(drafted, accepted + 1)):
            row = self._odds[min(match + i, MATCH_TOKENS)]
            row[0] = row[0] * k + (i < accepted)
            row[1] = row[1] * k + 1.0


def expected(chances: list[float]) -> float:
    """Tokens a draft is expected to have accepted, its i-th token's chance given that the
    ones before it are: c0 + c0 c1 + ..."""
    total, q = 0.0, 1.0
    for c in chances:
        q *= c
        total += q
    return total


@dataclass(slots=True)
class Lookup:
    """A lookup for drafts: its acceptance table, how many tokens it matched, what it
    found and their chances, and whether they were drafted (what the step verifies
    teaches the table either way)."""

    table: Acceptance
    match: int
    guess: list[int]
    chances: list[float]
    drafted: bool = False


class Drafter:
    """What a decoding sequence drafts each step, and what the engine learns from the
    step's verification. ``draft_tokens``: the most tokens a sequence drafts a step;
    ``memory_tokens``: the earlier answers kept to draft from (0: none); ``draft_min``: the
    fewest of a lookup's tokens drafted where it found any, whatever the step costs say (0:
    the costs decide; step times measured on a machine busy with other work are no guide)."""

    def __init__(
        self,
        draft_tokens: int,
        memory_tokens: int,
        costs: StepCosts,
        stats: GenerationStats,
        draft_min: int = 0,
    ) -> None:
        self.draft_tokens = draft_tokens
        self.draft_min = draft_min
        self.costs = costs
        self.stats = stats
        self.own = Acceptance()  # drafts from the sequence's own tokens
        self.memory = DraftMemory(memory_tokens)
        self.recall = Acceptance()  # drafts from earlier answers

    def draft(
        self, s: Sequence, room: int, expect: float, width: int, n_ctx: int
    ) -> tuple[list[int], float, list[Lookup]]:
        """The tokens ``s`` drafts this step (within ``room`` and as many as pay, the step
        so far yielding ``expect`` tokens from ``width`` logits), how many of them are
        expected to be accepted, and its lookups to learn from: its own tokens' and the
        earlier answers', the one expected to yield more tokens drafting. With no room left
        one token is still looked up: the guess to learn from."""
        want = s.room(max(1, min(room, self.draft_tokens)), n_ctx)
        looked: list[Lookup] = []
        best, best_gain = None, -1.0
        for table, (guess, match) in (
            (self.own, s.lookup(want, n_ctx)),
            (self.recall, self.memory.lookup(s.history, want)),
        ):
            if not guess:
                continue
            look = Lookup(table, match, guess, table.chances(match, min(room, len(guess))))
            gain = expected(look.chances)
            if gain > best_gain:
                best, best_gain = look, gain
            looked.append(look)
        if best is None:
            return [], 0.0, looked
        worth = self.costs.drafts_worth(best.chances, expect, width)
        drafts = best.guess[: max(worth, min(self.draft_min, len(best.chances)))]
        best.drafted = bool(drafts)
        return drafts, expected(best.chances[: len(drafts)]), looked

    def learn(self, looked: Iterable[Lookup], drafts: list[int], out: list[int]) -> None:
        """What each lookup's tokens would have done, as far as the step tells: ``out``
        are the tokens the step gave (the drafts it accepted, then its own)."""
        for look in looked:
            guess = drafts if look.drafted else look.guess
            k = 0
            while k < len(guess) and k < len(out) and guess[k] == out[k]:
                k += 1
            if look.drafted and look.table is self.recall:
                self.stats.recalled_tokens += len(drafts)
                self.stats.recalled_accepted_tokens += k
            look.table.learn(look.match, min(len(guess), len(out)), k)

    def verify(
        self, model: TokenModel, s: Sequence, i0: int, drafts: list[int], looked: Iterable[Lookup]
    ) -> list[int]:
        """Sample ``s``'s tokens from the step's logits at ``i0`` on: each draft the sampled
        token equals is accepted, and the first that differs ends it with the model's own
        token. Drops the rejected drafts' KV, counts, learns; returns the tokens out."""
        out: list[int] = []
        for j in range(len(drafts) + 1):
            t = model.sample(s.sampler, i0 + j)
            out.append(t)
            if j < len(drafts) and t == drafts[j]:
                continue
            break
        s.n_past += len(out)  # s.last and the accepted drafts are now in the KV cache
        if drafts:
            s.drafted += len(drafts)
            s.accepted += len(out) - 1
            self.stats.draft_tokens += len(drafts)
            self.stats.accepted_tokens += len(out) - 1
            if len(out) - 1 < len(drafts):
                model.seq_remove(s.slot, s.n_past, -1)  # the rejected drafts' KV
        self.learn(looked, drafts, out)
        return out
