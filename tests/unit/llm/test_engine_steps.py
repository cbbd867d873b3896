"""The engine's steps over a scripted token model: which earlier occurrence a draft
copies, how many tokens a step verifies, that a sequence whose drafts failed drafts again
once its text copies, and that a request whose sampler cannot be built fails alone.

The token after position q is always the script's token q + 1 (what a greedy model that
quotes its prompt would give). A step's cost is pinned to what steps of each size measured
on 2 vCPU (each token adds less than the one before), so that what the engine decides does
not depend on this machine's load."""

from __future__ import annotations

import threading
import time
from typing import Any

from milliserve.llm.drafts import Acceptance
from milliserve.llm.engine import Engine
from milliserve.llm.sequence import Event, GenRequest, Sequence
from milliserve.llm.step_plan import JOIN_MIN_S

PASSAGE = list(range(100, 200))  # the quoted text: 100 tokens, none repeated
# seconds of a step by its logit tokens (one sequence with its drafts), measured on 2 vCPU
CPU_STEPS = {1: 0.0084, 2: 0.0157, 3: 0.0210, 4: 0.0238, 6: 0.0327, 11: 0.0503}


class ScriptedModel:
    """A TokenModel whose sampled token is ``script[pos + 1]`` for the batch entry at ``pos``."""

    n_ctx_seq = 512
    batch_capacity = 1024
    threads = (1, 1)
    interruptible = False

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.pos: list[int] = []
        self.widths: list[int] = []  # logit tokens of each step

    def set_threads(self, n: int, n_batch: int) -> None:
        pass

    def piece(self, token: int, special: bool = False) -> bytes:
        return b"x"

    def is_eog(self, token: int) -> bool:
        return False

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> bool:
        self.pos = list(pos)
        self.widths.append(sum(logits))
        return True

    def interrupt(self, stop: bool = True) -> None:
        pass

    def new_sampler(self, spec: Any) -> Any:
        if spec == "unbuildable":
            raise TypeError("this function takes at least 5 arguments (4 given)")
        return object()

    def accept(self, sampler: Any, token: int) -> None:
        pass

    def sample(self, sampler: Any, index: int) -> int:
        q = self.pos[index] + 1
        return self.script[q] if q < len(self.script) else 0

    def free_sampler(self, sampler: Any) -> None:
        pass

    def seq_remove(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return True

    def seq_copy(self, src: int, dst: int, keep: int) -> None:
        pass

    def save_seq(self, seq: int) -> bytes:
        return b""

    def load_seq(self, seq: int, data: bytes) -> bool:
        return True


def _pin_costs(engine: Engine) -> None:
    engine.costs._decode = dict(CPU_STEPS)
    engine.costs.draft_token_s = 0.0042  # what a draft adds, on average over 1 to 10 drafts
    engine.costs.learn = lambda *args, **kwargs: None  # type: ignore[method-assign]


def _request(engine: Engine, prompt: list[int], max_tokens: int, sampler: Any = None) -> list[Event]:
    done = threading.Event()
    got: list[Event] = []

    def emit(ev: Event) -> None:
        got.append(ev)
        if ev.finish:
            done.set()

    engine.submit(GenRequest(prompt, max_tokens, sampler, emit))
    assert done.wait(120), "the request did not finish"
    return got


def _generate(
    prompt: list[int],
    output: list[int],
    draft_tokens: int = 10,
    requests: int = 1,
    memory: int = 0,
    draft_min: int = 0,
) -> Engine:
    """``requests`` requests of ``prompt``, one after the other, on one engine."""
    engine = Engine(
        ScriptedModel(prompt + output),
        2,
        256,
        draft_tokens=draft_tokens,
        draft_min=draft_min,
        speculate_below=3,
        draft_memory_tokens=memory,
    )
    engine.start().result(timeout=60)
    _pin_costs(engine)
    try:
        for _ in range(requests):
            got = _request(engine, prompt, len(output))
            assert got[-1].finish == "length", got[-1]
            assert sum(ev.tokens for ev in got) == len(output)
    finally:
        engine.close()
    return engine


def test_a_request_whose_sampler_cannot_be_built_fails_alone() -> None:
    """llama.cpp's penalties sampler was called with one argument too few: the TypeError
    came up through the engine's step, the engine thread stopped, and every request of
    the model failed from then on. Now that request gets its error and the engine goes on."""
    prompt = [1, 2, *PASSAGE[:10]]
    engine = Engine(ScriptedModel(prompt + PASSAGE[10:]), 2, 256)
    engine.start().result(timeout=60)
    try:
        failed = _request(engine, prompt, 4, sampler="unbuildable")
        assert [(ev.finish, ev.error) for ev in failed] == [
            ("error", "the sampler could not be built: this function takes at least 5 arguments (4 given)")
        ]
        after = _request(engine, prompt, 4)
        assert after[-1].finish == "length" and sum(ev.tokens for ev in after) == 4
        assert engine.running == 0
    finally:
        engine.close()


def test_a_sequence_whose_drafts_failed_drafts_again_once_its_text_copies_the_prompt() -> None:
    """Eight times the answer quotes two tokens of the passage and turns away (each draft
    made there fails), then it quotes the rest of the passage, 76 tokens. The failures
    brought the sequence's acceptance down to where no draft pays; the lookup's unverified
    guesses, right again from the copy's third token, bring drafting back, so most of the
    copy arrives as accepted drafts. Without them it never drafts again (0 accepted)."""
    output: list[int] = []
    for i in range(8):
        output += [*PASSAGE[3 * i : 3 * i + 2], 900 + i]
    output += PASSAGE[24:]
    engine = _generate([1, 2, *PASSAGE, 3], output)
    assert engine.stats.accepted_tokens >= 48, (engine.stats.draft_tokens, engine.stats.accepted_tokens)


def _sequence(history: list[int]) -> Sequence:
    req = GenRequest(history, 64, None, lambda ev: None)
    s = Sequence(req, 0, None, len(history), 0.0)
    s.n_past = len(history)
    return s


def test_a_draft_copies_the_occurrence_with_the_longest_matching_context() -> None:
    """ "A B said the lanes reduced" and "C D said the lanes brought": after "... C D said
    the lanes" the draft is "brought", though "reduced" follows a later occurrence of the
    three tokens "said the lanes" (the latest 3-token match drafted the wrong word)."""
    a, b, c, d, said, the, lanes, reduced, brought = range(10, 19)
    prompt = [c, d, said, the, lanes, brought, 7, a, b, said, the, lanes, reduced, 8]
    s = _sequence([*prompt, 9, c, d, said, the, lanes])
    assert s.lookup(2, 512) == ([brought, 7], 5)  # c d said the lanes
    s = _sequence([*prompt, 9, a, b, said, the, lanes])
    assert s.lookup(2, 512) == ([reduced, 8], 5)


def test_drafts_are_verified_where_they_pay_not_one_at_a_time() -> None:
    """A step's cost grows less with each token it verifies (CPU_STEPS). At 80% acceptance
    one draft costs more than it yields and three or more pay; at 60% none does."""
    engine = Engine(ScriptedModel([]), 2, 256, draft_tokens=10, speculate_below=3)
    _pin_costs(engine)
    assert engine.costs.drafts_worth([0.8], 1.0, 1) == 0
    assert engine.costs.drafts_worth([0.8] * 10, 1.0, 1) >= 3
    assert engine.costs.drafts_worth([0.6] * 10, 1.0, 1) == 0


def test_the_draft_room_follows_the_step_costs_and_one_stream_may_use_the_whole_target() -> None:
    """Measured steps here (flash attention on, the default; 250 tokens of context): one
    token 17 ms, two 30, three 40, four 52. A cost per draft learned from one-draft steps
    (13 ms) left room for one draft within 80% of the 50 ms target where the costs say two
    fit the whole of it. With one sequence decoding, a step that runs over delays only its
    own tokens: it may use the whole target; beside others, 80% of it."""
    engine = Engine(ScriptedModel([]), 8, 256, draft_tokens=10, speculate_below=3)
    _pin_costs(engine)
    engine.costs._decode = {1: 0.017, 2: 0.030, 3: 0.040, 4: 0.052, 8: 0.070}
    engine.costs.draft_token_s = 0.013
    assert engine.budget.draft_room(1) == 2  # step(3) = 40 ms <= 50, step(4) = 52 > 50
    assert engine.budget.draft_room(2) == 1  # step(3) = 40 ms <= 0.8 x 50, step(4) over it
    engine.budget.itl_budget_s = 0.075  # budget.itl_ms; past 8 tokens, the slope of 4 to 8 (4.5 ms)
    assert engine.budget.draft_room(1) == 8  # step(9) = 74.5 ms <= 75
    assert engine.budget.draft_room(2) == 3  # 0.8 x 75 = 60 ms: step(5) = 56.5, step(6) = 61
    engine.budget.itl_budget_s = 1.0
    assert engine.budget.draft_room(1) == 10  # never more than draft_tokens a sequence


def test_a_prompt_chunk_beside_decoding_streams_keeps_their_steps_near_the_itl_target() -> None:
    """A prompt chunk's floor of 16 tokens beside 7 decoding streams (36 ms) made 99 ms
    steps: every stream's ITL objective missed while the prompt's first token came late all
    the same. The floor is what fits the whole ITL target (50 ms here), at least MIN_CHUNK;
    with few streams the chunk fills 80% of it; alone, a prompt takes the whole step."""
    from milliserve.llm.step_plan import DEFAULT_ITL_S, MIN_CHUNK

    engine = Engine(ScriptedModel([]), 8, 256)
    _pin_costs(engine)
    engine.costs.prefill_token_s = 0.0039
    per = engine.costs.prefill_token_s
    seven = engine.budget.prefill(7)
    assert seven == MIN_CHUNK  # 36 ms + 4 x 3.9 = 52 ms, where 16 tokens made 98
    one = engine.budget.prefill(1)
    assert engine.costs.step(1) + one * per <= DEFAULT_ITL_S
    assert one >= int((0.8 * DEFAULT_ITL_S - engine.costs.step(1)) / per)
    assert engine.budget.prefill(0) == 256


def _seconds(engine: Engine) -> float:
    """What the steps of its requests cost at CPU_STEPS, the warm-up's left out."""
    model = engine.model
    assert isinstance(model, ScriptedModel)
    return sum(engine.costs.step(w) for w in model.widths[6:])


def _keyed_answer() -> tuple[list[int], list[int]]:
    """A prompt quoting PASSAGE, and an answer that repeats two tokens of its own (a JSON
    key) 16 times with a new value after each."""
    output: list[int] = []
    for i in range(16):
        output += [500, 501, 900 + i]
    return [1, 2, *PASSAGE, 3], output


def test_answers_whose_short_matches_never_continue_are_not_slowed_by_speculation() -> None:
    """Each answer repeats two tokens of its own (a JSON key) and writes a new value after
    them: every lookup after a 2-token match drafts the last value, which fails. A new
    sequence's acceptance used to start at 1, so each request drafted there before it
    learned, and speculation made the requests cost more than none (1.04x at these step
    costs; a real JSON answer took 10% longer). Learned by match length across the engine's
    sequences, the chance after 2-token matches is known low once, and drafting stops."""
    prompt, output = _keyed_answer()
    on = _generate(prompt, output, requests=3)
    off = _generate(prompt, output, draft_tokens=0, requests=3)
    assert _seconds(on) <= _seconds(off), (_seconds(on), _seconds(off), on.stats.draft_tokens)


def test_draft_min_drafts_what_a_lookup_found_where_the_costs_say_none_pays() -> None:
    """The answer of the test above, whose 2-token matches never continue: at these step
    costs the engine stops drafting there; with draft_min 2 every lookup that finds tokens
    drafts 2 of them (the answer itself unchanged: drafts are only verified)."""
    prompt, output = _keyed_answer()
    gated = _generate(prompt, output, requests=2)
    forced = _generate(prompt, output, requests=2, draft_min=2)
    assert forced.stats.draft_tokens > gated.stats.draft_tokens
    assert forced.stats.draft_tokens % 2 == 0, forced.stats.draft_tokens
    assert _seconds(forced) > _seconds(gated)


def test_an_answer_that_quotes_a_few_words_at_a_time_gains_from_speculation() -> None:
    """An answer that quotes three tokens of the text at a time, then one of its own, then
    a long passage: drafts pay where a match has grown long enough, and the answer costs
    less than with speculation off."""
    output: list[int] = []
    for i in range(12):
        output += [*PASSAGE[5 * i : 5 * i + 3], 900 + i]
    output += PASSAGE[60:90]
    prompt = [1, 2, *PASSAGE, 3]
    on = _generate(prompt, output)
    off = _generate(prompt, output, draft_tokens=0)
    assert _seconds(on) < _seconds(off), (_seconds(on), _seconds(off))
    assert on.stats.accepted_tokens >= 25, (on.stats.draft_tokens, on.stats.accepted_tokens)


def test_acceptance_is_learned_by_match_length() -> None:
    """Drafts after 2-token matches that fail lower the chance at 2, not at 12."""
    acc = Acceptance()
    long_before = acc.chances(12, 1)[0]
    for _ in range(30):
        acc.learn(2, 3, 0)
    assert acc.chances(2, 1)[0] < 0.1
    assert acc.chances(12, 1)[0] == long_before > 0.9
    # the i-th token of a draft is judged at the match it has when those before it are accepted
    for _ in range(30):
        acc.learn(12, 4, 4)
    assert acc.chances(10, 3)[2] > 0.95 and acc.chances(2, 3)[0] < 0.1


def test_a_prompt_asked_again_drafts_from_its_earlier_answer() -> None:
    """An answer that quotes nothing of its prompt gives prompt lookup nothing to draft;
    asked again, the engine's memory of the first answer drafts it, and every drafted
    token is accepted. Without the memory, the second answer takes as many steps as the
    first."""
    prompt = [1, 2, *PASSAGE[:20]]
    answer = list(range(300, 364))  # in no prompt
    once = _generate(prompt, answer, memory=4096)
    assert once.stats.draft_tokens == 0 and once.stats.steps == 1 + len(answer) - 1
    twice = _generate(prompt, answer, requests=2, memory=4096)
    st = twice.stats
    assert st.recalled_tokens == st.draft_tokens > 20
    assert st.recalled_accepted_tokens == st.accepted_tokens == st.draft_tokens
    assert st.steps < 2 * once.stats.steps - 20
    off = _generate(prompt, answer, requests=2, memory=0)
    assert off.stats.draft_tokens == 0 and off.stats.steps == 2 * once.stats.steps


def test_drafts_wait_while_a_prompt_is_prefilled_beside_them() -> None:
    """A sequence's drafts took the step's room before a prompt's chunks did: the prompt got
    only its floor each step, and at 8 streams of grounded prompts starting together,
    speculation on made 0.93x the tokens/s of off (benchmarks/llm.py, llm-speculation). Now a
    step that prefills drafts nothing; once the prompt is in, both sequences draft again."""
    prompt = [1, 2, *PASSAGE, 3]
    model = ScriptedModel(prompt + PASSAGE * 3)
    engine = Engine(model, 2, 256, draft_tokens=10, draft_min=4, speculate_below=3)
    _pin_costs(engine)
    engine.costs.prefill_token_s = 0.0039
    done = threading.Event()
    engine.submit(GenRequest(prompt, 200, None, lambda ev: done.set() if ev.finish else None))
    for _ in range(4):
        engine._step()
    assert engine.stats.draft_tokens > 0, "the lone sequence drafts"
    long_prompt = [1, 2, *PASSAGE, *PASSAGE, 3]
    engine.submit(GenRequest(long_prompt, 200, None, lambda ev: None))
    engine._step()  # admits it; its first chunk
    steps = 1
    while any(s.prefilled < len(s.req.prompt) for s in engine._running):
        drafted = engine.stats.draft_tokens
        engine._step()
        assert engine.stats.draft_tokens == drafted, f"drafts beside a prompt chunk (step {steps})"
        steps += 1
    assert steps > 1, "the prompt took more than one step"
    drafted = engine.stats.draft_tokens
    for _ in range(3):
        engine._step()
    assert engine.stats.draft_tokens > drafted, "drafting resumes once the prompt is in"
    assert not done.is_set()


class ContendedModel(ScriptedModel):
    """Two threads configured, and a one-token step on two threads takes 40 ms where one
    thread takes 2 ms: a machine whose other work leaves one core free (two spinning
    threads waited for a descheduled one at every barrier)."""

    threads = (2, 2)

    def __init__(self, script: list[int]) -> None:
        super().__init__(script)
        self.n = 2
        self.steps: list[tuple[int, int]] = []  # (tokens, threads) of each decode

    def set_threads(self, n: int, n_batch: int) -> None:
        self.n = n

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> bool:
        self.steps.append((len(tokens), self.n))
        time.sleep(0.04 if self.n == 2 else 0.002)
        return super().decode(tokens, pos, seqs, logits)


def test_the_warmup_measures_both_thread_counts_and_the_first_request_runs_on_the_faster() -> None:
    """The warm-up's one-token steps take turns on two threads and one: a request's very
    first steps run on the count that measured faster. (Its one-token steps used to start
    on the config's count, the other tried every 4th step until each had 3 steps.)"""
    prompt = [1, 2, *PASSAGE[:10]]
    model = ContendedModel(prompt + PASSAGE[10:])
    engine = Engine(model, 2, 256)
    engine.start().result(timeout=60)
    try:
        warm = len(model.steps)
        assert [n for t, n in model.steps[:warm] if t == 1] == [2, 1, 2, 1, 2, 1]
        assert engine.threads_one.chosen(1) == 1
        assert engine.costs.step(1) < 0.02  # seeded from the count that runs
        got = _request(engine, prompt, 12)
        assert got[-1].finish == "length"
        ones = [n for t, n in model.steps[warm:] if t == 1]
        assert len(ones) >= 10 and set(ones) == {1}, ones
    finally:
        engine.close()


def _burst(itl_budget_s: float | None) -> tuple[Engine, int]:
    """One chat starts alone; 7 more arrive during its first step (a burst) and wait beside it
    when it has one token out. Returns the engine and the steps until all 8 have prompts in."""
    model = ScriptedModel(list(range(1000)))
    engine = Engine(model, 9, 256, itl_budget_s=itl_budget_s, draft_tokens=0)
    _pin_costs(engine)
    engine.costs.prefill_token_s = 0.0039
    engine.submit(GenRequest(list(range(30)), 200, None, lambda ev: None))
    engine._step()  # its prompt, alone: its first token
    for i in range(7):
        engine.submit(GenRequest([500 + i, *range(1, 30)], 200, None, lambda ev: None))
    steps = 0
    while steps < 50 and (engine._incoming or any(s.prefilled < len(s.req.prompt) for s in engine._running)):
        engine._step()
        steps += 1
    return engine, steps


def test_a_burst_waiting_beside_a_stream_one_token_old_joins_it_whole() -> None:
    """A burst's first request starts alone; the rest arrive during that step and wait beside
    a stream one token old. Held to the ITL share they took 14 steps of a few tokens each
    (their TTFT p99 1.1-2.0 s against llama-server's 0.5 s); the stream that has just begun
    takes one long gap instead, once: a prompt arriving later beside it gets the share. Under
    an explicit budget.itl_ms every gap keeps the budget, and the burst is chunked."""
    engine, steps = _burst(None)
    assert steps == 1, "7 prompts of 30 tokens beside a one-token-old stream: one step"
    assert all(s.generated == 1 or s.req.prompt[0] == 0 for s in engine._running)
    engine.submit(GenRequest([600, *range(1, 30)], 200, None, lambda ev: None))
    engine._step()
    late = next(s for s in engine._running if s.req.prompt[0] == 600)
    assert late.prefilled < len(late.req.prompt), "beside streams that took their long gap: the share"
    _, steps = _burst(0.05)
    assert steps > 1, "under budget.itl_ms the burst is chunked"


class _Held(ScriptedModel):
    """A ScriptedModel whose first ``held`` steps wait until the test lets them go, and that
    stops a step as llama.cpp does when ``interrupt`` was called (nothing of it happened)."""

    interruptible = True

    def __init__(self, script: list[int], held: int) -> None:
        super().__init__(script)
        self.held = held
        self.stop = False
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def interrupt(self, stop: bool = True) -> None:
        self.stop = stop

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> bool:
        if self.held:
            self.held -= 1
            self.entered.release()
            assert self.go.acquire(timeout=60)
        if self.stop:
            return False
        return super().decode(tokens, pos, seqs, logits)


def test_a_burst_arriving_while_the_first_prompt_runs_alone_joins_it() -> None:
    """8 chats sent at once reach the engine one by one: the first one's prompt step begins
    alone, the others arrive while it runs. They stop it, and the prompts run in the next
    step together, no stream decoding beside them (as llama-server takes a burst): before,
    7 joined beside the first one's first token and that stream took one long gap (the
    pooled ITL p99 of 16-token answers, 361 ms against llama-server's 107). A late one of
    the burst stops the step run again too, within half of what the step should take,
    counted from the burst's first step; after that, an arrival waits for the step."""
    model = _Held(list(range(1000)), held=3)
    engine = Engine(model, 9, 256, draft_tokens=0)
    _pin_costs(engine)
    engine.costs.prefill_token_s = 10.0  # the step's first half lasts through the test

    def req(first: int) -> GenRequest:
        return GenRequest([first, *range(1, 30)], 200, None, lambda ev: None)

    def step() -> threading.Thread:
        t = threading.Thread(target=engine._step)
        t.start()
        assert model.entered.acquire(timeout=60)  # the step is in llama_decode
        return t

    engine.submit(req(500))
    t = step()
    for i in range(6):
        engine.submit(req(501 + i))
    model.go.release()
    t.join(60)
    assert engine.stats.interrupted == 1 and not any(s.generated for s in engine._running)
    t = step()  # 7 prompts; the eighth arrives during it
    engine.submit(req(507))
    model.go.release()
    t.join(60)
    assert engine.stats.interrupted == 2 and not any(s.generated for s in engine._running)
    t = step()  # all 8
    model.go.release()
    t.join(60)
    assert model.widths[-1] == 8 and len(model.pos) == 8 * 30  # one step: 8 prompts, whole
    assert sorted(s.generated for s in engine._running) == [1] * 8

    # past the window (prompt tokens as good as free: its floor, JOIN_MIN_S), a request
    # arriving waits for the step in flight
    model = _Held(list(range(1000)), held=1)
    engine = Engine(model, 9, 256, draft_tokens=0)
    _pin_costs(engine)
    engine.costs.prefill_token_s = 0.0
    engine.submit(req(500))
    t = step()
    time.sleep(5 * JOIN_MIN_S)
    engine.submit(req(501))
    model.go.release()
    t.join(60)
    assert engine.stats.interrupted == 0 and [s.generated for s in engine._running] == [1]
    assert len(engine._incoming) == 1  # it waits for the next step


def test_a_request_arriving_while_a_prompt_step_is_planned_is_taken_into_it() -> None:
    """Admission copies each prompt's cached prefix before the step begins; a burst's chats
    arriving meanwhile found no step in flight to stop, and waited it out: 3 chats of a
    burst waited out a 112 ms step of 5 prompts, then took one of 93 ms. They are taken
    into the step, planned again, with no step run or stopped; a step with streams
    decoding is not held back so."""

    class Arriving(ScriptedModel):
        """Requests arrive as the engine sets the step's threads (after planning it)."""

        def __init__(self, script: list[int]) -> None:
            super().__init__(script)
            self.arrive: list[GenRequest] = []

        def set_threads(self, n: int, n_batch: int) -> None:
            if self.arrive:
                engine.submit(self.arrive.pop())

    def req(first: int) -> GenRequest:
        return GenRequest([first, *range(1, 30)], 200, None, lambda ev: None)

    model = Arriving(list(range(1000)))
    engine = Engine(model, 9, 256, draft_tokens=0)
    _pin_costs(engine)
    engine.submit(req(500))
    model.arrive = [req(503), req(502), req(501)]  # one at each planning: 3 plans again
    while not engine._running or any(s.prefilled < len(s.req.prompt) for s in engine._running):
        engine._step()
    assert model.widths == [4] and len(model.pos) == 4 * 30  # one step: 4 prompts, whole
    assert engine.stats.interrupted == 0
    # beside decoding streams, an arrival waits for the next step
    model.arrive = [req(504)]
    engine._step()
    assert model.widths[-1] == 4 and len(engine._incoming) == 1


def test_a_priority_prompt_run_alone_is_not_joined_by_a_later_arrival() -> None:
    """A priority request's prompt runs alone in the step after it stopped the streams' step,
    so that its first token does not share a step with theirs. A request arriving while
    that step runs is not a burst to join: it neither stops the step nor joins it."""
    model = _Held(list(range(1000)), held=0)
    engine = Engine(model, 9, 256, draft_tokens=0, preemption="priority")
    _pin_costs(engine)
    engine.costs.prefill_token_s = 10.0  # a step of prompts only would be joinable throughout

    def req(first: int, level: int) -> GenRequest:
        return GenRequest([first, *range(1, 30)], 200, None, lambda ev: None, level=level)

    engine.submit(req(500, 1))
    engine._step()  # the background stream's prompt and first token
    engine.submit(req(600, 0))  # priority: stops the step in flight (none here), runs alone next
    model.held = 1
    t = threading.Thread(target=engine._step)
    t.start()
    assert model.entered.acquire(timeout=60)  # the priority prompt's step is in llama_decode
    engine.submit(req(700, 1))
    model.go.release()
    t.join(60)
    assert engine.stats.interrupted == 0 and model.widths[-1] == 1 and len(model.pos) == 30
    assert sorted((s.req.level, s.generated) for s in engine._running) == [(0, 1), (1, 1)]
    assert len(engine._incoming) == 1  # it waits for the next step
