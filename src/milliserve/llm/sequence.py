"""One generation request, and the state of a request that holds a sequence slot: its
tokens (with an index for prompt-lookup drafting), its text held back for stop strings,
and its drafting statistics; and what the engine has learned of how often a drafted token
is accepted."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Acceptance", "Event", "GenRequest", "Sequence", "held_back"]

# prompt lookup: the most earlier occurrences of a token weighed per draft (the latest), and
# the most tokens of context compared at each (a few microseconds a sequence a step)
MATCH_CANDIDATES = 64
MATCH_TOKENS = 12


@dataclass(slots=True)
class Event:
    """What a request's consumer receives: new text (possibly empty), the tokens it took,
    and on the last event the finish reason and the request's timing."""

    text: str
    tokens: int
    finish: str | None = None  # "stop", "length", "abort", "error"
    error: str | None = None
    usage: dict[str, int] | None = None
    timing: dict[str, float] | None = None


@dataclass(slots=True, eq=False)
class GenRequest:
    """One generation request. ``emit`` is called on the engine thread and must be cheap
    and thread-safe (the servable posts to the event loop)."""

    prompt: list[int]
    max_tokens: int
    sampler: Any
    emit: Callable[[Event], None]
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    speculate: bool = True
    penalties: bool = False  # feed the prompt to the sampler's history
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    client: str = ""  # who sent it (fair admission: llm.admission)
    level: int = 0  # priority level, 0 first


class Sequence:
    """A request that holds a sequence slot."""

    __slots__ = (
        "accepted",
        "admitted",
        "cached",
        "dec",
        "drafted",
        "first_at",
        "generated",
        "history",
        "index",
        "last",
        "last_at",
        "n_past",
        "pending",
        "prefilled",
        "ran_from",
        "req",
        "sampler",
        "saved",
        "slot",
        "stop_len",
    )

    def __init__(self, req: GenRequest, slot: int, sampler: Any, reused: int, now: float) -> None:
        self.req = req
        self.slot = slot
        self.sampler = sampler
        self.n_past = reused  # tokens of this sequence in the KV cache
        self.prefilled = reused  # prompt tokens in the KV cache
        self.cached = reused
        self.generated = 0
        self.last = -1  # the sampled token not yet in the KV cache
        self.history: list[int] = list(req.prompt)
        self.index: dict[int, list[int]] = {}  # token -> positions in history (prompt lookup)
        for i, t in enumerate(self.history):
            self.index.setdefault(t, []).append(i)
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = ""  # decoded text held back (a stop string may begin in it)
        self.stop_len = max((len(s) for s in req.stop), default=0)
        self.admitted = now
        self.first_at = 0.0
        self.last_at = 0.0
        self.drafted = 0
        self.accepted = 0
        self.ran_from = 0  # tokens generated when it was admitted or last resumed
        self.saved = b""  # its KV while it is suspended (preemption)

    @property
    def decoding(self) -> bool:
        """Its prompt is all in the KV cache: it generates a token a step."""
        return self.prefilled == len(self.req.prompt)

    def push_history(self, token: int) -> None:
        self.index.setdefault(token, []).append(len(self.history))
        self.history.append(token)

    def room(self, want: int, n_ctx: int) -> int:
        """How many of ``want`` drafted tokens this sequence has room for: its output's
        length and its KV cache's."""
        return min(want, self.req.max_tokens - self.generated - 1, n_ctx - self.n_past - 2)

    def lookup(self, want: int, n_ctx: int) -> tuple[list[int], int]:
        """Up to ``want`` tokens that followed the earlier occurrence of the sequence's last
        token whose context matches the most tokens before it (at least 2; up to
        MATCH_TOKENS; the latest among equals), and how many matched (the last token
        included). A text that quotes the same words twice ("... said the bicycle lanes
        reduced ..." and "... said the bicycle lanes brought ...") is told apart by the
        words before them, where the latest 3-token match would draft the wrong
        continuation."""
        h = self.history
        n_hist = len(h)
        room = self.room(want, n_ctx)
        if room <= 0 or n_hist < 3:
            return [], 0
        cands = self.index.get(h[-1])
        if not cands or len(cands) < 2:
            return [], 0
        best, best_at = 1, -1
        end = n_hist - 1
        for p in reversed(cands[-1 - MATCH_CANDIDATES : -1]):  # the last one is the current position
            n = 1
            while n < MATCH_TOKENS and n <= p and h[p - n] == h[end - n]:
                n += 1
            if n > best:
                best, best_at = n, p
                if n == MATCH_TOKENS:
                    break
        return (h[best_at + 1 : best_at + 1 + room], best) if best >= 2 else ([], 0)


class Acceptance:
    """The chance that a drafted token is accepted, by how many tokens of context its
    lookup matched, learned from every sequence of the engine.

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


def held_back(pending: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``pending`` that begins some stop string."""
    best = 0
    for x in stops:
        for k in range(min(len(x) - 1, len(pending)), best, -1):
            if x.startswith(pending[len(pending) - k :]):
                best = k
                break
    return best
