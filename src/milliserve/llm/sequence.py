"""One generation request, and the state of a request that holds a sequence slot: its
tokens (with an index for prompt-lookup drafting), its text held back for stop strings,
and its drafting statistics."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from milliserve.llm.token_model import TokenModel

__all__ = ["Event", "GenRequest", "Sequence", "held_back", "longest_match"]

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
    # its expected time to first token at admission (llm.calibration; 0: none made): the
    # estimate, the raw one it was calibrated from, and its case (idle, slot, queued)
    estimate: float = 0.0
    estimate_raw: float = 0.0
    case: int = 0
    refused: str = ""  # evicted from the queue for a newcomer (fair share): why
    load_s: float = 0.0  # the request that loaded its model on demand: the load's seconds


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
        "stretched",
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
        self.stretched = False  # it has had a step past the ITL share for prompts to join whole

    @property
    def decoding(self) -> bool:
        """Its prompt is all in the KV cache: it generates a token a step."""
        return self.prefilled == len(self.req.prompt)

    def push_history(self, token: int) -> None:
        self.index.setdefault(token, []).append(len(self.history))
        self.history.append(token)

    def take(self, new: list[int], model: TokenModel) -> tuple[str, int, str | None]:
        """Account sampled tokens ``new`` (a token, then the drafts accepted with it): the
        text they add that may go out now (an end that could begin a stop string is held
        back), how many of them were used, and why the sequence ends, if it does: "stop"
        (EOS or a stop string) or "length" (``max_tokens``, or the context is full). Unless a
        stop string ends it, the text held back goes out at the end: an answer that ended on
        EOS after a line break, with a blank line as its stop string, had lost that break."""
        req = self.req
        text: list[str] = []
        finish: str | None = None
        flush = False
        used = 0
        for t in new:
            used += 1
            self.generated += 1
            if model.is_eog(t) and not req.ignore_eos:
                finish, flush = "stop", True
                break
            self.push_history(t)
            self.pending += self.dec.decode(model.piece(t))
            if self.stop_len:
                cut = min((i for i in (self.pending.find(x) for x in req.stop) if i >= 0), default=-1)
                if cut >= 0:
                    text.append(self.pending[:cut])
                    self.pending = ""
                    finish = "stop"
                    break
                keep = held_back(self.pending, req.stop)
                text.append(self.pending[: len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep :]
            else:
                text.append(self.pending)
                self.pending = ""
            if self.generated >= req.max_tokens or self.n_past + 1 >= model.n_ctx_seq:
                finish, flush = "length", True
                break
        self.last = new[used - 1]
        if flush:
            text.append(self.pending + self.dec.decode(b"", final=True))
            self.pending = ""
        return "".join(text), used, finish

    def usage(self) -> dict[str, int]:
        """Its tokens, for the last event: the OpenAI ``usage`` fields and the drafts'."""
        prompt = len(self.req.prompt)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.generated,
            "total_tokens": prompt + self.generated,
            "cached_tokens": self.cached,
            "draft_tokens": self.drafted,
            "accepted_draft_tokens": self.accepted,
        }

    def timing(self, now: float) -> dict[str, float]:
        """Its times in ms, for the last event (``now``: when it ended); TTFT -1 if it had no token."""
        req = self.req
        arrival = req.arrival
        out = {
            "queue_ms": (self.admitted - arrival) * 1e3,
            "ttft_ms": (self.first_at - arrival) * 1e3 if self.first_at else -1.0,
            "e2e_ms": (now - arrival) * 1e3,
        }
        if req.estimate > 0.0:  # what admission expected the TTFT to be
            out["ttft_est_ms"] = req.estimate * 1e3
        if req.load_s > 0.0:  # its model was loaded for it (its TTFT includes the load)
            out["load_ms"] = req.load_s * 1e3
        return out

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
        # the last one is the current position; the slice stays MATCH_CANDIDATES long, not
        # a copy of every occurrence of a common token each step
        at, best = longest_match(h, cands[-1 - MATCH_CANDIDATES : -1], h)
        return (h[at + 1 : at + 1 + room], best) if best >= 2 else ([], 0)


def longest_match(text: list[int], cands: list[int], history: list[int]) -> tuple[int, int]:
    """Of the latest MATCH_CANDIDATES positions ``cands`` in ``text`` (each holding
    ``history``'s last token), the one whose tokens before it match the most of
    ``history``'s (up to MATCH_TOKENS; the latest among equals), and how many matched, the
    last token included; (-1, 1) when none matches more than that token."""
    best, best_at = 1, -1
    end = len(history) - 1
    for p in reversed(cands[-MATCH_CANDIDATES:]):
        n = 1
        while n < MATCH_TOKENS and n <= min(p, end) and text[p - n] == history[end - n]:
            n += 1
        if n > best:
            best, best_at = n, p
            if n == MATCH_TOKENS:
                break
    return best_at, best


def held_back(pending: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``pending`` that begins some stop string."""
    best = 0
    for x in stops:
        for k in range(min(len(x) - 1, len(pending)), best, -1):
            if x.startswith(pending[len(pending) - k :]):
                best = k
                break
    return best
