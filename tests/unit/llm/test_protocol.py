"""Parsing of OpenAI and Triton generate requests: every field a client may get wrong is a
RequestError naming it."""

from __future__ import annotations

from typing import Any

import pytest

from milliserve.errors import RequestError
from milliserve.llm.generate_extension import parse_generate
from milliserve.llm.sequence import held_back
from milliserve.openai.completions import parse_openai, server_timing
from milliserve.openai.error_body import openai_error


def test_chat_request_is_parsed() -> None:
    p = parse_openai(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
            ],
            "max_completion_tokens": 7,
            "temperature": 0,
            "stop": "END",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        chat=True,
    )
    assert p.messages is not None and [m.content for m in p.messages] == ["Be brief.", "Hi there"]
    assert (p.max_tokens, p.temperature, p.stop, p.seed) == (7, 0.0, ("END",), 3)
    assert p.stream and p.include_usage


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": {"a": 1}}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 1.5}, "seed"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
def test_bad_chat_fields_are_named(doc: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_openai(doc, chat=True)
    assert err.value.args[1] == param


def test_bad_bodies() -> None:
    with pytest.raises(RequestError):
        parse_openai([1, 2], chat=False)
    with pytest.raises(RequestError):
        parse_openai({"model": "m", "prompt": ""}, chat=False)
    assert parse_openai({"model": "m", "prompt": ["one"]}, chat=False).prompt == "one"


def test_generate_extension_fields() -> None:
    p = parse_generate(
        {
            "text_input": "Hello",
            "max_tokens": 5,
            "parameters": {"temperature": 0.5},
            "sampling_parameters": '{"top_k": 4, "stop": ["x"]}',
        }
    )
    assert (p.prompt, p.max_tokens, p.temperature, p.top_k, p.stop) == ("Hello", 5, 0.5, 4, ("x",))
    with pytest.raises(RequestError):
        parse_generate({"parameters": {}})
    with pytest.raises(RequestError):
        parse_generate({"text_input": "x", "sampling_parameters": "{not json"})


def test_stop_string_hold_back() -> None:
    assert held_back("hello wor", ("world",)) == 3
    assert held_back("hello", ("world",)) == 0
    assert held_back("a\n", ("\n\n", "xyz")) == 1


def test_answers() -> None:
    assert (
        server_timing({"queue_ms": 1.25, "ttft_ms": 30.0, "e2e_ms": -1.0})
        == "queue;dur=1.250, ttft;dur=30.000"
    )
    err = openai_error(429, "slow down")["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"


def test_thread_choice_follows_measurements_and_keeps_exploring() -> None:
    from milliserve.llm.threads import ThreadChoice

    tc = ThreadChoice(1, 2, explore_every=8)
    assert tc.pick(8) == 2  # the config's count until the other is measured better
    for _ in range(3):
        tc.record(8, 2, 0.010)
        tc.record(8, 1, 0.001)
    assert tc.chosen(8) == 1 and tc.chosen(4) == 2  # sizes are compared with their own kind
    picks = [tc.pick(8) for _ in range(40)]
    assert picks.count(1) > picks.count(2) > 0  # mostly the faster, now and then the other
    tc.record(8, 1, 0.5)  # one step preempted by another process: a spike, not a trend
    assert tc.chosen(8) == 1
    for _ in range(3):  # the machine got busy: most of one thread's recent steps are slow
        tc.record(8, 1, 0.5)
    assert tc.chosen(8) == 2
    assert ThreadChoice(2, 2).pick(100) == 2


def test_thread_choice_explores_rarely_on_a_steady_machine_and_soon_when_it_gets_busy() -> None:
    from milliserve.llm.threads import ThreadChoice

    tc = ThreadChoice(1, 2)
    cost = {2: 0.010, 1: 0.020}  # an idle machine: two threads twice as fast

    def run(steps: int) -> list[int]:
        picks = []
        for _ in range(steps):
            t = tc.pick(8)
            tc.record(8, t, cost[t])
            picks.append(t)
        return picks

    first = run(600)
    assert first[:16].count(1) == 3  # tried three times at first
    assert first[16:].count(1) <= 2  # then about every 512th step: a long gap costs every stream
    cost[2] = 0.030  # other work arrived: two threads now spin against it
    busy = run(40)
    assert 1 in busy[:20]  # the slower count in use makes it look again soon
    assert tc.chosen(8) == 1  # and one thread, now faster, is chosen


def test_thread_choice_ignores_preempted_steps_and_returns_when_the_burst_ends() -> None:
    """A few two-thread steps preempted by another process (a client on the same 2 vCPUs)
    made a running mean choose one thread, and two threads were measured again only every
    512th step: 800-1000 steps in a row at about 12.8 ms where two threads took 10.0."""
    from milliserve.llm.threads import ThreadChoice

    tc = ThreadChoice(1, 2)
    cost = {2: 0.010, 1: 0.020}
    step = 0

    def run(steps: int, spike_every: int = 0) -> list[int]:
        nonlocal step
        picks = []
        for _ in range(steps):
            step += 1
            t = tc.pick(1)
            spiked = spike_every and step % spike_every == 0
            tc.record(1, t, cost[t] * (6 if spiked else 1))
            picks.append(t)
        return picks

    run(100)
    spiky = run(1000, spike_every=9)  # one step in 9 preempted, six times as long
    assert spiky.count(1) <= 4  # an explore or two: the spikes never chose one thread
    cost[2] = 0.030  # a burst of other work: two threads spin against it
    run(60)
    assert tc.chosen(1) == 1
    cost[2] = 0.010  # the burst is over
    back = run(200)
    # looked at again after the gap reached in the burst (16, then 32, then 64 steps),
    # and chosen again within 100 steps, not after the next 512th
    assert 2 in back[:70]
    assert back[-100:].count(1) == 0


def test_thread_choice_tries_the_other_count_only_where_the_step_stays_within_the_itl_target() -> None:
    """A one-thread trial on a step of 7 streams took 82 ms where two threads took 35, a gap
    over a 60 ms ITL objective in each stream. A trial is made where it is expected to take
    at most the ITL target (or what the chosen count takes now): small steps are still
    tried, big ones are not, and they are again once the chosen count is as slow."""
    from milliserve.llm.threads import ThreadChoice

    tc = ThreadChoice(1, 2)
    cost = {2: 0.0044, 1: 0.0080}  # per token, a step of 8 streams: 35 ms on two threads, 64 on one
    for _ in range(8):  # one-token steps measured both ways: one thread takes 1.8x as long
        tc.record(1, 2, 0.010)
        tc.record(1, 1, 0.018)

    one = {2: 0.010, 1: 0.018}

    def run(steps: int) -> tuple[list[int], list[int]]:
        """``steps`` steps of 8 streams, each after a one-token step (a stream alone)."""
        picks, singles = [], []
        for _ in range(steps):
            t = tc.pick(1, 0.050)
            tc.record(1, t, one[t])
            singles.append(t)
            t = tc.pick(8, 0.050)
            tc.record(8, t, cost[t])
            picks.append(t)
        return picks, singles

    picks, singles = run(1100)
    assert picks.count(1) == 0  # never tried: 1.8 x 35 ms is over the 50 ms target
    assert singles.count(1) >= 1  # one-token steps (18 ms on one thread) still are
    # the machine got busy: two threads now take 80 ms a step of 8, 30 ms a step of one
    cost[2], one[2] = 0.0100, 0.030
    picks, singles = run(100)
    assert 1 in singles[:40]  # the one-token steps find one thread faster first,
    assert 1 in picks  # then a trial on 8 is expected to take less than the step does now
    assert tc.chosen(8) == 1
    # another process took a core while 8 streams decoded, and no stream was alone: two
    # threads took 3 s a step of 8 (measured here), one-token steps never ran. The ratio
    # measured on one-token steps says nothing of that: one thread is tried all the same
    tc = ThreadChoice(1, 2)
    cost, one = {2: 0.0044, 1: 0.0080}, {2: 0.010, 1: 0.018}
    assert run(300)[0].count(1) == 0
    cost[2] = 0.375
    picks = []
    for _ in range(60):
        t = tc.pick(8, 0.050)
        tc.record(8, t, cost[t])
        picks.append(t)
    assert 1 in picks[:20] and tc.chosen(8) == 1
    # without a limit, the same steps are tried as before
    free = ThreadChoice(1, 2)
    picks = []
    for _ in range(16):
        t = free.pick(8)
        free.record(8, t, 0.0044 if t == 2 else 0.0080)
        picks.append(t)
    assert picks.count(1) == 3


def test_a_machine_busy_from_the_start_finds_one_thread_for_steps_of_many_streams() -> None:
    """Beside two CPU burners, steps of 8 streams took 3 s each on two threads for the whole
    run, and one thread was never tried: with no smaller step measured both ways, its cost
    was guessed from the counts (twice two threads', 6 s), over what the step took. The
    one-token steps (the fallback) had measured one thread faster on the same machine; that
    ratio is used, and a size not yet measured both ways starts where they chose (one
    thread), and keeps it. On an idle machine their ratio keeps a step of 8 (35 ms on two
    threads) off one thread under a 50 ms target, as before."""
    from milliserve.llm.threads import ThreadChoice

    def run(one: dict[int, float], cost: dict[int, float], steps: int = 40) -> tuple[list[int], ThreadChoice]:
        single, batch = ThreadChoice(1, 2), ThreadChoice(1, 2)
        batch.fallback = single
        for _ in range(3):  # the warm-up's one-token steps, both ways
            for t in (2, 1):
                single.record(1, t, one[t])
        picks = []
        for _ in range(steps):  # 8 streams decoding, never a one-token step
            t = batch.pick(8, 0.050)
            batch.record(8, t, cost[t])
            picks.append(t)
        return picks, batch

    picks, batch = run({2: 2.0, 1: 0.030}, {2: 0.38, 1: 0.009})  # busy: 3 s against 72 ms
    # the first steps start where the one-token steps measured; two threads, retried
    # later, are measured slower again
    assert picks[:8] == [1] * 8 and batch.chosen(8) == 1 and picks[-10:] == [1] * 10
    # the burners stop: two threads' estimate (the one-token steps' ratio, old now) would
    # keep them off for good; the config's count is tried every explore_every steps anyway
    # and, faster, taken back
    cost = {2: 0.0044, 1: 0.0080}
    picks = []
    for _ in range(700):
        t = batch.pick(8, 0.050)
        batch.record(8, t, cost[t])
        picks.append(t)
    assert batch.chosen(8) == 2 and picks[-100:].count(1) <= 1
    picks, batch = run({2: 0.010, 1: 0.018}, {2: 0.0044, 1: 0.0080}, 600)  # idle
    assert picks.count(1) == 0


def test_prompt_chunks_are_not_tried_on_the_slower_count() -> None:
    """A trial of one thread on a prompt chunk is one request's first token at about half
    speed, and every new size of prompt was tried 3 times: prompt chunks follow what the
    smaller steps (or one-token steps) measured instead."""
    from milliserve.llm.threads import ThreadChoice

    one = ThreadChoice(1, 2)
    tc = ThreadChoice(1, 2)
    tc.fallback = one
    # prompts of many lengths on an idle machine, where two threads are faster
    picks = []
    for n in range(40, 1000, 7):
        t = tc.pick(n)
        tc.record(n, t, 0.003 * (2 if t == 1 else 1))
        picks.append(t)
    assert picks.count(1) == 0
    # one-token steps measured one thread faster (a busy machine): prompts follow them
    for _ in range(3):
        one.record(1, 2, 0.030)
        one.record(1, 1, 0.012)
    assert tc.pick(300) == 1
    # steps of 8 drafted tokens measured both ways: prompts follow those, the nearest in size
    for _ in range(3):
        tc.record(8, 2, 0.004)
        tc.record(8, 1, 0.008)
    assert tc.pick(300) == 2


def test_a_modest_edge_for_one_thread_on_small_steps_does_not_carry_to_big_ones() -> None:
    """On an idle 2 vCPU VM one-token steps took 8.8 ms on one thread and 10.5-12.4 on two
    (the second thread's fixed cost at each op), and prompt chunks and the first steps of 8
    streams followed them: a burst's 50 prompt tokens took 261 ms on one thread, where 64
    took 167 on two. A smaller size's choice of one thread carries over only where it was
    CARRY times faster: a descheduled thread (a busy machine), not a fixed cost."""
    from milliserve.llm.threads import CARRY, ThreadChoice

    single, batch = ThreadChoice(1, 2), ThreadChoice(1, 2)
    batch.fallback = single
    for _ in range(3):  # the warm-up's one-token steps, both ways: one thread 1.3x faster
        single.record(1, 2, 0.0115)
        single.record(1, 1, 0.0088)
    assert single.chosen(1) == 1  # where it was measured, the faster count is kept
    assert batch.pick(50) == 2 and batch.pick(8, 0.050) == 2
    for _ in range(3):  # one stream with 2 drafts, both ways: one thread still a bit faster
        batch.record(3, 2, 0.0100)
        batch.record(3, 1, 0.0090)
    assert batch.chosen(3) == 1 and batch.pick(64) == 2 and batch.pick(8, 0.050) == 2
    # a busy machine: two threads more than CARRY times slower on the small steps
    for _ in range(7):
        batch.record(3, 2, 0.0090 * CARRY * 1.1)
    assert batch.pick(64) == 1 and batch.pick(8, 0.050) == 1
