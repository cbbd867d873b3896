"""The prefix cache: prompts whose KV is kept in spare sequence slots, so that a later
prompt sharing a long enough beginning (a system prompt, a few-shot header) starts from
a copy of it. Used by the engine thread; ``hit`` may also be read from the event loop
for an estimate."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PrefixCache"]


@dataclass(slots=True)
class _Prefix:
    slot: int
    tokens: list[int]
    used_at: float


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Up to ``len(slots)`` cached prompts; a match needs ``min_tokens`` shared tokens."""

    def __init__(self, slots: list[int], min_tokens: int) -> None:
        self._free = list(reversed(slots))
        self._entries: list[_Prefix] = []
        self.min_tokens = min_tokens

    def _best(self, prompt: list[int]) -> tuple[_Prefix | None, int]:
        best, n_best = None, 0
        for p in list(self._entries):
            n = _common_prefix(p.tokens, prompt)
            if n >= self.min_tokens and n > n_best:
                best, n_best = p, n
        return best, min(n_best, len(prompt) - 1)  # the last prompt token is decoded for logits

    def hit(self, prompt: list[int]) -> int:
        """Prompt tokens a cached prefix would spare."""
        return self._best(prompt)[1]

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
        if any(_common_prefix(p.tokens, prompt) >= self.min_tokens for p in self._entries):
            return -1  # its family is cached
        if self._free:
            slot = self._free.pop()
        else:
            old = min(self._entries, key=lambda p: p.used_at)
            self._entries.remove(old)
            slot = old.slot
        self._entries.append(_Prefix(slot, list(prompt), now))
        return slot
