"""The sequence slots of a context: which one a sequence takes, and which cached KV it
starts from (what the slot kept of its last sequence, another free slot's, a prefix
slot's, or a prompt saved in host memory). Used by the engine thread; ``cached`` may also
be read from the event loop for an estimate."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterable

from milliserve.llm.prefix import HostCache, PrefixCache, common_prefix
from milliserve.llm.sequence import Sequence
from milliserve.llm.token_model import TokenModel
from milliserve.runtime.stats import GenerationStats

__all__ = ["Slots"]

log = logging.getLogger(__name__)


class Slots:
    """``max_sequences`` slots for running sequences (ids 0, 1, ...), then ``prefix_slots``
    for the prefix cache, and a host-memory cache of ``host_cache_bytes``.

    A free slot keeps the KV of the sequence that ended in it (``kept``, unless ``reuse`` is
    off): a later prompt that begins with those tokens (the next turn of a chat, a repeated
    prompt, a shared system prompt) starts from there instead of prefilling them again."""

    def __init__(
        self,
        model: TokenModel,
        max_sequences: int,
        prefix_slots: int,
        min_prefix_tokens: int,
        host_cache_bytes: int,
        reuse: bool,
        stats: GenerationStats,
    ) -> None:
        self.model = model
        self.stats = stats
        self.free = list(range(max_sequences))  # a heap: the lowest free slot first
        self.kept: dict[int, list[int]] = {}
        self.reuse = reuse
        # what a source of KV costs, in prompt tokens' worth of prefill (measured on 2 vCPU:
        # a token 2.7 ms; restoring 200 tokens from host memory 2 ms, a slot copy 10 ms)
        self.copy_tokens = 6
        self.restore_tokens = 2
        self.host = HostCache(host_cache_bytes, min_prefix_tokens)
        self.prefixes = PrefixCache(
            list(range(max_sequences, max_sequences + prefix_slots)), min_prefix_tokens
        )

    def cached(self, prompt: list[int]) -> int:
        """Prompt tokens whose KV a new request could reuse now (a kept slot or a prefix
        slot). Read from the event loop too: a snapshot, no lock."""
        n = len(prompt) - 1  # the last prompt token is decoded for its logits
        kept = max((common_prefix(t, prompt) for t in list(self.kept.values())), default=0)
        return max(0, min(n, max(kept, self.prefixes.hit(prompt))))

    def take(self, prompt: list[int], running: Iterable[Sequence]) -> int:
        """The free slot a sequence takes, beside the ``running`` ones: one that keeps
        the running slots as few runs of consecutive ids as the lowest free slot would
        (llama.cpp decodes each run of a batch as one more pass over the weights), and among
        those the one whose kept KV shares most with ``prompt``, then the lowest."""
        free = self.free
        if len(free) == 1 or not self.kept:
            return heapq.heappop(free)
        taken = {s.slot for s in running}

        def runs(extra: int) -> int:
            ids = sorted(taken | {extra})
            return 1 + sum(1 for a, b in itertools.pairwise(ids) if b != a + 1)

        least = min(runs(x) for x in free)
        kept = self.kept
        slot = max(
            (x for x in free if runs(x) == least),
            key=lambda x: (common_prefix(kept[x], prompt) if x in kept else 0, -x),
        )
        free.remove(slot)
        heapq.heapify(free)
        return slot

    def start(self, slot: int, prompt: list[int], now: float) -> int:
        """Give ``slot`` the longest cached beginning of ``prompt``: its own kept KV, a
        copy of another free slot's or of a prefix slot's, or one restored from host
        memory. Returns the tokens reused."""
        m = self.model
        n = len(prompt) - 1  # the last prompt token is decoded for its logits
        own_tokens = self.kept.pop(slot, None)
        own = min(n, common_prefix(own_tokens, prompt)) if own_tokens is not None else 0
        other, other_n = -1, 0
        for x, tokens in self.kept.items():
            c = min(n, common_prefix(tokens, prompt))
            if c > other_n:
                other, other_n = x, c
        source, prefix_n = self.prefixes.peek(prompt)
        saved, saved_n = self.host.best(prompt) if self.host.max_bytes else (None, 0)
        saved_n = min(n, saved_n)
        if own_tokens is not None and own < len(own_tokens) and self.host.max_bytes:
            self.save(slot, own_tokens, now)  # about to be cut: keep it in host memory
        copied = max(other_n, prefix_n) - self.copy_tokens
        restored = saved_n - self.restore_tokens if saved is not None else -1
        if restored > own and restored >= copied and saved is not None:
            if m.load_seq(slot, saved.data):
                saved.used_at = now
                m.seq_remove(slot, saved_n, -1)
                self.stats.host_cache_hits += 1
                return saved_n
            log.warning("restoring %d saved prompt tokens failed; prefilling them", saved_n)
            own_tokens, own = None, 0  # the failed load emptied the slot
        if copied > own:
            if prefix_n >= other_n:
                self.prefixes.reuse(prompt, now)
                m.seq_copy(source, slot, prefix_n)
                return prefix_n
            m.seq_copy(other, slot, other_n)
            return other_n
        if own_tokens is not None:
            m.seq_remove(slot, own, -1)  # the kept tokens past the shared beginning
        return own

    def take_empty(self, tokens: list[int], running: Iterable[Sequence], now: float) -> int:
        """A free slot for a suspended sequence of ``tokens`` to be restored into: what it
        kept goes to host memory (when there is one) and is dropped."""
        slot = self.take(tokens, running)
        kept = self.kept.pop(slot, None)
        if kept is not None and self.host.max_bytes:
            self.save(slot, kept, now)
        return slot

    def prefilled(self, slot: int, prompt: list[int], now: float) -> None:
        """``slot`` holds all of ``prompt``'s KV now: the prefix cache may keep a copy."""
        keep = self.prefixes.remember(prompt, now)
        if keep >= 0:
            self.model.seq_copy(slot, keep, len(prompt))

    def save(self, slot: int, tokens: list[int], now: float) -> None:
        """Keep ``slot``'s KV of ``tokens`` in host memory (long enough ones, not held yet)."""
        if len(tokens) < 2 * self.host.min_tokens or self.host.holds(tokens):
            return
        self.host.put(tokens, self.model.save_seq(slot), now)

    def release(self, slot: int, keep: list[int] | None = None) -> None:
        """``slot`` is free again. It keeps the KV of ``keep`` (the tokens of the sequence
        that ended in it) where slots are reused; otherwise its KV is removed."""
        if keep is None or not self.reuse:
            self.model.seq_remove(slot)
            self.kept.pop(slot, None)
        else:
            self.kept[slot] = keep
        heapq.heappush(self.free, slot)
