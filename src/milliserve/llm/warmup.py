"""The engine's warm-up: the first step costs and thread choice, measured before any
request."""

from __future__ import annotations

import time

from milliserve.llm.costs import StepCosts
from milliserve.llm.threads import ThreadChoice
from milliserve.llm.token_model import TokenModel

__all__ = ["warm_up"]


def warm_up(model: TokenModel, one: ThreadChoice, batch: ThreadChoice, costs: StepCosts) -> None:
    """Seed ``costs`` with one prefill and a few decode steps, and the choice for one-token
    steps (``one``) with each thread count's; ``batch`` is the choice for bigger steps.

    The one-token steps run three times on each thread count, taking turns, and seed the
    thread choice, so that the first request runs on the faster count; the steps timed
    after them run on it. Under two CPU burners on 2 vCPU, two threads' one-token steps
    took 24 ms or 1-3 s (one thread spinning at a barrier for the other, descheduled),
    one thread's 22-50 ms: the warm-up had seeded a step at 3 s and a prompt token at
    97 ms, and a request's first dozen steps went on trials. The first decode pages the
    weights in and is not timed."""
    m = model
    slot = 0
    prompt = [1] * 32
    # the first decode pages the weights in (untimed); the timed prompt comes after
    m.decode(prompt, list(range(32)), [slot] * 32, [False] * 31 + [True])
    counts = list(dict.fromkeys((one.default, one.other)))  # one where both are 1
    times: dict[int, list[float]] = {n: [] for n in counts}
    for i in range(3 * len(counts)):
        n = counts[i % len(counts)]
        m.set_threads(n, n)
        t0 = time.perf_counter()
        m.decode([1], [32 + i], [slot], [True])
        times[n].append(time.perf_counter() - t0)
        one.record(1, n, times[n][-1])
    best = one.chosen(1)
    t = times[best]
    m.set_threads(best, best if best != one.default else batch.default)
    pos = 32 + 3 * len(counts)
    t0 = time.perf_counter()
    m.decode(prompt, list(range(pos, pos + 32)), [slot] * 32, [False] * 31 + [True])
    prompt_s = time.perf_counter() - t0
    pos += 32
    t0 = time.perf_counter()  # a one-token step with 3 drafts to verify
    m.decode([1] * 4, list(range(pos, pos + 4)), [slot] * 4, [True] * 4)
    four = time.perf_counter() - t0
    t0 = time.perf_counter()  # and with 7
    m.decode([1] * 8, list(range(pos + 4, pos + 12)), [slot] * 8, [True] * 8)
    costs.seed(min(t), four, prompt_s, eight=time.perf_counter() - t0)
    m.seq_remove(slot)
