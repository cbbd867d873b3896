"""How many threads a generation step of several tokens uses, chosen by measurement."""

from __future__ import annotations

__all__ = ["ThreadChoice"]


class ThreadChoice:
    """How many threads a step uses: the config's count (``n_threads`` for one-token steps,
    ``n_threads_batch`` for bigger ones) unless the other count (one thread) has measured
    at least 10% faster per token, over at least 3 steps of the same size, lately. On a
    machine shared with other work, llama.cpp's threads can spin against the other
    processes and two threads can be slower than one; which is faster changes with the
    load, so every ``explore_every``-th step of a size tries the other count (a one-thread step
    costs about twice a two-thread one on an idle machine: exploring every 64th costs ~1.5%)."""

    def __init__(self, low: int, high: int, explore_every: int = 64) -> None:
        self.default = high
        self.other = low
        self.explore_every = explore_every
        self._cost: dict[tuple[int, int], tuple[float, int]] = {}  # (size, threads) -> (ewma, n)
        self._steps: dict[int, int] = {}

    @staticmethod
    def size(n_tokens: int) -> int:
        """Steps are compared with steps of the same size (exact up to 16 tokens, then by 64)."""
        return n_tokens if n_tokens <= 16 else 16 + n_tokens // 64 * 64

    def _better(self, size: int) -> int:
        mine = self._cost.get((size, self.default))
        alt = self._cost.get((size, self.other))
        if mine is None or alt is None or mine[1] < 3 or alt[1] < 3:
            return self.default
        return self.other if alt[0] < 0.9 * mine[0] else self.default

    def pick(self, n_tokens: int) -> int:
        if self.default == self.other:
            return self.default
        size = self.size(n_tokens)
        step = self._steps.get(size, 0) + 1
        self._steps[size] = step
        best = self._better(size)
        if step % self.explore_every == 0 or (step <= 12 and step % 4 == 0):
            return self.other if best == self.default else self.default  # explore (more at first)
        return best

    def record(self, n_tokens: int, threads: int, seconds_per_token: float) -> None:
        key = (self.size(n_tokens), threads)
        old = self._cost.get(key)
        self._cost[key] = (
            (seconds_per_token, 1) if old is None else (0.7 * old[0] + 0.3 * seconds_per_token, old[1] + 1)
        )

    def chosen(self, n_tokens: int) -> int:
        """The count preferred now for steps of ``n_tokens``."""
        return self._better(self.size(n_tokens))
