"""How many threads a generation step uses, chosen by measurement."""

from __future__ import annotations

__all__ = ["ThreadChoice"]


# steps of this size and more (prompt chunks) follow the choice of smaller steps
PROMPT_SIZE = 16
# a count's cost: the median of its last WINDOW steps of a size
WINDOW = 7
# where the other count is chosen, the config's is tried again after this many steps (doubling)
RETRY = 16
# a smaller size's choice of the other count carries over to a size not measured both ways
# only where the other count measured at least this many times faster there (_prior)
CARRY = 2.0


class ThreadChoice:
    """How many threads a step uses: the config's count (``n_threads`` for one-token steps,
    ``n_threads_batch`` for bigger ones) unless the other count (one thread) has measured
    at least 10% faster per token, over at least 3 steps of the same size, lately. A size
    not yet measured both ways starts on the other count where the smaller sizes, or the
    one-token steps (``fallback``), measured it at least CARRY times faster (``_prior``).

    On a machine shared with other work, llama.cpp's threads can spin against the other
    processes and two threads can be slower than one, and which is faster changes with
    the load. But a step on the slower count costs every running stream a long gap (a
    one-thread step takes about twice a two-thread one on an idle machine), so the other
    count is tried 3 times at first, then only when the count in use has become 25% slower
    than its best lately (the machine got busier: every 16th step until that settles) and
    otherwise every ``explore_every``-th step of a size (0.2%).

    A count's cost is the median of its last ``WINDOW`` steps of a size, not a running
    mean: one step preempted by another process (a client parsing its stream on the same
    two cores) took 3-10 times its usual time, and a mean that took it in chose one thread,
    then measured two threads again only every 512th step. With two servers taking turns at
    one stream on 2 vCPUs, each with its client, that held one thread for 800 to 1000 steps
    in a row, at about 12.8 ms a token where two threads took 10.0 (stop 47). Where the
    other count is chosen, the config's count is tried again after 16 steps, the gap
    doubling (to ``explore_every``) while it stays slower and back to 16 when a trial beats
    the chosen count: the machine that made one thread faster is usually busy for a while,
    not for good.

    Given the ITL target (``pick``'s ``limit_s``), a trial is made only where the count
    tried is expected, at its best lately, to take at most that or what the count in use
    takes now (``_may_try``): small steps are tried, big ones once the machine slowed the
    count in use past what the trial could take.

    Prompt chunks (PROMPT_SIZE tokens and more) are not tried on their own: a trial is one
    request's first token on the slower count, and each size of prompt was tried 3 times.
    In 70 one-stream requests over new texts those 3 trials (480 ms against 270 on two
    threads) were the 3 slowest first tokens, and in a run of 200 they set the TTFT p99.
    Prompt chunks take the choice measured for the biggest smaller steps, or for one-token
    steps (``fallback``) where none was."""

    def __init__(self, low: int, high: int, explore_every: int = 512, drift: float = 1.25) -> None:
        self.default = high
        self.other = low
        self.explore_every = explore_every
        self.drift = drift
        self._recent: dict[tuple[int, int], list[float]] = {}  # (size, threads) -> last WINDOW
        self._cost: dict[tuple[int, int], tuple[float, int]] = {}  # (size, threads) -> (median, n)
        self._base: dict[tuple[int, int], float] = {}  # the lowest median lately (rises 1% a step)
        self._steps: dict[int, int] = {}
        self._explored: dict[int, int] = {}  # size -> the step it last tried the other count
        self._retry: dict[int, int] = {}  # size -> steps until the config's count is tried again
        # what prompt chunks follow when no smaller step was measured both ways
        self.fallback: ThreadChoice | None = None

    @staticmethod
    def size(n_tokens: int) -> int:
        """Steps are compared with steps of about the same size: 1, 2-3, 4-7, 8-15, then by 64."""
        if n_tokens >= 16:
            return 16 + n_tokens // 64 * 64
        return 1 << (n_tokens.bit_length() - 1)

    def _measured_below(self, size: int) -> int | None:
        """The biggest size under ``size`` whose two counts have both been measured."""
        sizes = [k for k, t in self._cost if t == self.default and k < size and self._both(k)]
        return max(sizes, default=None)

    def _both(self, size: int) -> bool:
        """Both counts have been measured over at least 3 steps of ``size``."""
        n = self._cost.get
        return n((size, self.default), (0.0, 0))[1] >= 3 and n((size, self.other), (0.0, 0))[1] >= 3

    def _better(self, size: int) -> int:
        if not self._both(size):
            return self._prior(size)
        mine, alt = self._cost[(size, self.default)], self._cost[(size, self.other)]
        return self.other if alt[0] < 0.9 * mine[0] else self.default

    def _prior(self, size: int) -> int:
        """The count for a size not yet measured both ways: the choice at the biggest
        smaller size that was, else the fallback's for one-token steps, else the config's.
        Starting on the config's count, a busy machine's first steps of 8 streams took 3 s
        each on two threads until one thread's 3 trials were made (every 4th step, 27 s in
        all), where one-token steps had already measured one thread 60 times faster.

        The other count carries over only where it measured CARRY times faster: a smaller
        step's modest edge for one thread is the second thread's fixed cost at each op,
        which a bigger step spreads over more rows. On an idle 2 vCPU VM one-token steps took
        8.8 ms on one thread and 10.5-12.4 on two; carried over, a burst's 50 prompt tokens
        took 261 ms on one thread, where 64 took 167 on two (a round's TTFT p99 493 ms, the
        others' 257-273), and its first steps of 8 streams 55 ms against 30. Two threads
        twice as slow on the smallest steps is not that cost but a descheduled thread (other
        work on the cores), and that slows a step of any size."""
        below = self._measured_below(size)
        if below is not None:
            return self._carried(below)
        fb = self.fallback
        if fb is not None and fb.other == self.other and fb._both(1) and fb._carried(1) == fb.other:
            return self.other
        return self.default

    def _carried(self, size: int) -> int:
        """The count a bigger size not measured both ways starts on, from ``size`` (measured
        both ways): the other where it measured CARRY times faster, else the config's."""
        mine, alt = self._cost[(size, self.default)][0], self._cost[(size, self.other)][0]
        return self.other if CARRY * alt <= mine else self.default

    def _at_best(self, size: int, threads: int, n_tokens: int) -> float | None:
        """Seconds a step of ``n_tokens`` takes on ``threads`` where the machine lets it: its
        lowest median lately at this size, else the other count's times the two counts'
        measured ratio (``_ratio``); None where neither count has run at this size (the
        other needs three steps)."""
        mine = self._base.get((size, threads), self._cost.get((size, threads), (None, 0))[0])
        if mine is not None:  # its own steps of this size (fewer than 3: their median)
            return mine * n_tokens
        alt = self.other if threads == self.default else self.default
        theirs = self._base.get((size, alt))
        if theirs is None:
            return None
        return theirs * self._ratio(size, threads, alt) * n_tokens

    def _ratio(self, size: int, threads: int, alt: int) -> float:
        """How much longer a step takes on ``threads`` than on ``alt``, measured: at the
        biggest smaller size measured both ways, else on the fallback's one-token steps
        (the same machine, the same other work), else guessed from the counts.

        Guessing from the counts held two threads for good on a machine busy from the
        start: beside two CPU burners each step of 8 streams took 3 s on two threads (one
        spinning at a barrier for the other, descheduled), the guess said one thread would
        take 6, and one thread was never tried, where the one-token steps had measured it
        60 times faster (stop 55: 5 streams of 200 tokens not done in 300 s)."""
        below = self._measured_below(size)
        if below is not None:
            return self._cost[(below, threads)][0] / max(self._cost[(below, alt)][0], 1e-9)
        fb = self.fallback
        if fb is not None and fb.other == self.other and fb._both(1):
            # the low count against the fallback's own (its config's count for one token)
            low = fb._cost[(1, fb.other)][0] / max(fb._cost[(1, fb.default)][0], 1e-9)
            return low if threads == self.other else 1 / low
        return alt / threads

    def _may_try(self, size: int, count: int, current: int, n_tokens: int, limit_s: float | None) -> bool:
        """Whether a trial of ``count`` on this step is expected, at its best, to stay within
        ``limit_s`` (the ITL target) or within what ``current`` takes now. A one-thread
        trial on a step of 7 streams took 82 ms (two threads: 35) and gave each stream a gap
        over a 60 ms ITL objective; in an open loop at half of capacity such trials came
        every 3 s or so. Where other work slows the count in use (two threads beside one
        busy process took 3 s a step of 8 here) the trial is made: it is not expected to
        do worse."""
        if limit_s is None:
            return True
        trial = self._at_best(size, count, n_tokens)
        now = self._cost.get((size, current))
        if trial is None or now is None:
            return True
        return trial <= max(limit_s, now[0] * n_tokens)

    def pick(self, n_tokens: int, limit_s: float | None = None) -> int:
        """Threads for a step of ``n_tokens``; a trial of the count not chosen is made only
        where it is expected to take at most ``limit_s`` (or what the chosen count takes)."""
        if self.default == self.other:
            return self.default
        size = self.size(n_tokens)
        if size >= PROMPT_SIZE:
            # a prompt chunk: no trial of its own, the choice for the biggest smaller steps
            # measured both ways (the same machine, the same contention), else the fallback's
            return self._prior(size)
        step = self._steps.get(size, 0) + 1
        self._steps[size] = step
        best = self._better(size)
        other = self.other if best == self.default else self.default
        tried = self._cost.get((size, other), (0.0, 0))[1]
        now = self._cost.get((size, best))
        base = self._base.get((size, best))
        drifted = now is not None and base is not None and now[0] > self.drift * base
        since = step - self._explored.get(size, 0)
        if best != self.default:  # the config's count, slower lately: is it still?
            # every explore_every steps it is tried whatever its estimate says: that may
            # be old (one-token steps measured on a busy machine, the machine idle since)
            wait = self._retry.get(size, RETRY)
            forced = since >= self.explore_every
            if since >= wait and (forced or self._may_try(size, other, best, n_tokens, limit_s)):
                self._explored[size] = step
                self._retry[size] = min(2 * wait, self.explore_every)
                return other
            return best
        self._retry.pop(size, None)
        due = (tried < 3 and step % 4 == 0) or step % self.explore_every == 0 or (drifted and since >= 16)
        if due and self._may_try(size, other, best, n_tokens, limit_s):
            self._explored[size] = step
            return other
        return best

    def record(self, n_tokens: int, threads: int, seconds_per_token: float) -> None:
        size = self.size(n_tokens)
        key = (size, threads)
        recent = self._recent.setdefault(key, [])
        recent.append(seconds_per_token)
        del recent[:-WINDOW]
        cost = sorted(recent)[len(recent) // 2]
        n = self._cost.get(key, (0.0, 0))[1] + 1
        self._cost[key] = (cost, n)
        if n >= 3:
            base = self._base.get(key)
            self._base[key] = cost if base is None else min(base * 1.01, cost)
        if threads == self.default and size in self._retry:
            chosen = self._cost.get((size, self.other))
            if chosen is not None and seconds_per_token < chosen[0]:
                self._retry[size] = RETRY  # the config's count beat the chosen one: look again soon

    def chosen(self, n_tokens: int) -> int:
        """The count preferred now for steps of ``n_tokens``."""
        return self._better(self.size(n_tokens))
