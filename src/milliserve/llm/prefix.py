"""The prefix cache: prompts whose KV is kept in spare sequence slots, so that a later
prompt sharing a long enough beginning (a system prompt, a few-shot header) starts from
a copy of it. Used by the engine thread; ``hit`` may also be read from the event loop
for an estimate."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostCache", "PrefixCache", "common_prefix"]


@dataclass(slots=True)
class _Prefix:
    slot: int
    tokens: list[int]
    used_at: float


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share at their start (slices compared in C, halving
    the differing range: prompts are thousands of tokens and this runs per admission)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """Up to ``len(slots)`` cached prompts; a match needs ``min_tokens`` shared tokens."""

    def __init__(self, slots: list[int], min_tokens: int) -> None:
        self._free = list(reversed(slots))
        self._entries: list[_Prefix] = []
        self.min_tokens = min_tokens

    def _best(self, prompt: list[int]) -> tuple[_Prefix | None, int]:
        best, n_best = None, 0
        for p in list(self._entries):
            n = common_prefix(p.tokens, prompt)
            if n >= self.min_tokens and n > n_best:
                best, n_best = p, n
        return best, min(n_best, len(prompt) - 1)  # the last prompt token is decoded for logits

    def hit(self, prompt: list[int]) -> int:
        """Prompt tokens a cached prefix would spare."""
        return self._best(prompt)[1]

    def peek(self, prompt: list[int]) -> tuple[int, int]:
        """(the slot holding the best match, tokens it spares), or (-1, 0) when none."""
        best, n = self._best(prompt)
        return (-1, 0) if best is None or n < self.min_tokens else (best.slot, n)

    def reuse(self, prompt: list[int], now: float) -> tuple[int, int]:
        """(the slot holding the best match, tokens it spares), or (-1, 0) when none."""
        best, n = self._best(prompt)
        if best is None or n < self.min_tokens:
            return -1, 0
        best.used_at = now
        return best.slot, n

    def remember(self, prompt: list[int], now: float) -> int:
        """The slot to copy this prompt's KV into, when no cached prompt shares ``min_tokens``
        with it (the least recently used is evicted when all are taken); else -1."""
        if (not self._entries and not self._free) or len(prompt) < self.min_tokens * 2:
            return -1
        if any(common_prefix(p.tokens, prompt) >= self.min_tokens for p in self._entries):
            return -1  # its family is cached
        if self._free:
            slot = self._free.pop()
        else:
            old = min(self._entries, key=lambda p: p.used_at)
            self._entries.remove(old)
            slot = old.slot
        self._entries.append(_Prefix(slot, list(prompt), now))
        return slot


@dataclass(slots=True)
class _Saved:
    tokens: list[int]
    data: bytes
    used_at: float


class HostCache:
    """KV of ended sequences, saved to host memory (``llama_state_seq_get_data``) when
    their slot is taken by a prompt that begins differently, and restored into a slot for
    a later prompt that begins the same way (a repeated prompt, the next turn of a chat
    whose slot was reused meanwhile). Bounded by ``max_bytes``, least recently used out."""

    def __init__(self, max_bytes: int, min_tokens: int) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.bytes = 0
        self._entries: list[_Saved] = []

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: list[int]) -> tuple[_Saved | None, int]:
        """The entry sharing most with ``prompt`` (at least ``min_tokens``) and that count."""
        best, n_best = None, 0
        for e in self._entries:
            n = common_prefix(e.tokens, prompt)
            if n >= self.min_tokens and n > n_best:
                best, n_best = e, n
        return best, n_best

    def holds(self, tokens: list[int]) -> bool:
        """Whether an entry already covers ``tokens`` (begins with all of them)."""
        return any(
            len(e.tokens) >= len(tokens) and common_prefix(e.tokens, tokens) == len(tokens)
            for e in self._entries
        )

    def put(self, tokens: list[int], data: bytes, now: float) -> None:
        if len(data) > self.max_bytes:
            return
        # an entry that this one extends is now redundant
        for e in [e for e in self._entries if common_prefix(e.tokens, tokens) == len(e.tokens)]:
            self._drop(e)
        while self._entries and self.bytes + len(data) > self.max_bytes:
            self._drop(min(self._entries, key=lambda e: e.used_at))
        self._entries.append(_Saved(tokens, data, now))
        self.bytes += len(data)

    def _drop(self, e: _Saved) -> None:
        self._entries.remove(e)
        self.bytes -= len(e.data)
