"""The continuous-batching engine: one thread owns a llama.cpp context and, every step,
decodes one batch holding the next token of every running sequence.

A step:

1. takes cancellations (a client gone) and frees those sequences' KV at once;
2. admits waiting requests into free sequence slots, reusing the KV of a cached
   prompt prefix when one matches (copied from a prefix slot);
3. builds one batch: for each decoding sequence its last token (and, while the batch
   is small, a few tokens drafted by prompt lookup), then prompt chunks of the
   sequences still prefilling, up to the step's token budget, so that a long prompt
   does not stall the others;
4. runs ``llama_decode`` once (it releases the GIL; the event loop keeps serving);
5. samples each sequence's token(s), verifies drafts, detokenizes, checks stop
   strings, EOS and ``max_tokens``, and hands text to the request's consumer.

No lock serialises requests: the event loop only appends to the waiting queue and
sets cancel flags; everything else happens on the engine thread. The engine knows
the model through ``TokenModel`` (``backends/llama_cpp.py`` implements it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from milliserve.llm.admission import Preemption, WaitingRoom, ahead_of, evictable, fair_claim
from milliserve.llm.calibration import Estimate, TtftCalibration
from milliserve.llm.costs import StepCosts
from milliserve.llm.drafts import Drafter
from milliserve.llm.sequence import Event, GenRequest, Sequence
from milliserve.llm.slots import Slots
from milliserve.llm.step_plan import JoinWindow, PlannedStep, StepBudget, plan_step
from milliserve.llm.suspension import Suspended
from milliserve.llm.threads import ThreadChoice
from milliserve.llm.token_model import TokenModel
from milliserve.llm.ttft_estimate import first_token_wait
from milliserve.llm.warmup import warm_up
from milliserve.runtime.stats import GenerationStats

__all__ = ["Engine", "TokenModel"]

log = logging.getLogger(__name__)


class Engine:
    """The engine loop and its queue. ``submit`` and ``cancel`` are called from the event
    loop; everything else runs on the engine thread."""

    def __init__(
        self,
        model: TokenModel,
        max_sequences: int,
        step_tokens: int,
        prefix_slots: int = 0,
        min_prefix_tokens: int = 16,
        host_cache_bytes: int = 0,
        reuse_slots: bool = True,
        draft_tokens: int = 0,
        draft_min: int = 0,
        speculate_below: int = 0,
        draft_memory_tokens: int = 0,
        stats: GenerationStats | None = None,
        itl_budget_s: float | None = None,
        preemption: str = "fair",
        name: str = "llm",
        spawn: Callable[[str, Callable[[], None]], threading.Thread] | None = None,
    ) -> None:
        self.model = model
        self.max_sequences = max_sequences
        self.speculate_below = speculate_below
        self.stats = stats or GenerationStats()
        # which slot a sequence takes and which cached KV it starts from (llm/slots.py)
        self.slots = Slots(
            model, max_sequences, prefix_slots, min_prefix_tokens, host_cache_bytes, reuse_slots, self.stats
        )
        self._running: list[Sequence] = []
        # who runs next: priority, then fairness across clients (llm/admission.py)
        self._waiting = WaitingRoom()
        self._incoming: deque[GenRequest] = deque()
        self.preemption = Preemption(preemption, max_sequences)
        # preempted sequences, their KV in host memory up to a cap (llm/suspension.py)
        self._suspended = Suspended(max(host_cache_bytes, 64 << 20))
        self._cancels = False  # set by cancel(): the waiting room has a request to drop
        # set by submit() when a request outranks a running sequence: the best such level
        # (preemption: priority). The step in flight stops, and the next one is its prefill alone
        self._urgent: int | None = None
        self._wake = threading.Event()
        self._join = JoinWindow()  # a burst joins a step of prompts only (llm/step_plan.py)
        self._stop = False
        # what steps cost (llm/costs.py), seeded by warmup(); what decoding sequences draft,
        # from where, and how often those drafts are accepted (llm/drafts.py)
        self.costs = StepCosts()
        self.drafter = Drafter(draft_tokens, draft_memory_tokens, self.costs, self.stats, draft_min)
        # how much a step holds beside its streams (llm/step_plan.py)
        self.budget = StepBudget(self.costs, step_tokens, itl_budget_s, draft_tokens)
        self.mean_output = 128.0  # tokens a finished request generated, on average (EWMA)
        # the TTFT estimate's running error, learned from first tokens (llm/calibration.py)
        self.calibration = TtftCalibration()
        # waiting requests the event loop evicted for a newcomer, not yet dropped (evict())
        self._evicted: set[GenRequest] = set()
        # threads of a one-token step and of a bigger one: the config's counts, or one thread
        # where that has measured faster lately (a machine busy with other work)
        single, batch = model.threads
        self.threads_one = ThreadChoice(1, single)
        self.threads = ThreadChoice(1, batch)
        self.threads.fallback = self.threads_one
        self.stats.running = lambda: len(self._running)
        self.stats.waiting = lambda: len(self._waiting) + len(self._incoming)
        self.stats.suspended = lambda: len(self._suspended)
        self.stats.kv_tokens = lambda: sum(s.n_past for s in self._running)
        self.stats.kv_capacity = max_sequences * model.n_ctx_seq
        self.stats.host_cache_bytes = lambda: self.slots.host.bytes
        self.stats.ttft_calibration = self.calibration.factors
        make = spawn or (lambda n, f: threading.Thread(target=f, name=n, daemon=True))
        self._thread = make(f"ms-engine-{name}", self._loop)

    # ---- event-loop side ----
    def start(self) -> Future[None]:
        """Start the engine thread. It runs ``warmup`` first; the future resolves once it
        did (or holds its exception, and the thread is gone).

        Every ``llama_decode`` of a context must come from this one thread: llama.cpp's
        CPU backend runs a step as an OpenMP parallel region, and a second thread that has
        run one (a loader thread kept alive in its pool) leaves libgomp with more threads
        than cores. It then stops spinning between regions, and a one-token step took
        28 ms instead of 10 on 2 vCPU (docs/design.md)."""
        self._started: Future[None] = Future()
        self._thread.start()
        return self._started

    def submit(self, req: GenRequest) -> None:
        self._incoming.append(req)
        if self._room():
            self._join.join(time.perf_counter(), self.model.interrupt)  # a burst
        if (
            self.preemption.priority
            and self.model.interruptible
            and any(s.req.level > req.level for s in list(self._running))
        ):
            # it would wait for the end of the step in flight (a whole step of every stream),
            # then share the next with them: stop that step, and prefill it alone next
            self._urgent = req.level if self._urgent is None else min(self._urgent, req.level)
            self.model.interrupt()
        self._wake.set()

    def _room(self) -> bool:  # a slot for every request not yet admitted (a burst may join)
        return len(self._running) + len(self._incoming) <= self.max_sequences

    def cancel(self, req: GenRequest) -> None:
        req.cancelled = True
        self._cancels = True
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._incoming)

    @property
    def running(self) -> int:
        return len(self._running)

    def waiting_of(self, client: str) -> tuple[int, int]:
        """(requests of ``client`` waiting, clients waiting or running): a snapshot."""
        mine = sum(len(reqs) for _, c, reqs in self._waiting.snapshot() if c == client)
        mine += sum(1 for r in list(self._incoming) if r.client == client)
        return mine, len(self._waiting.clients() | {r.client for r in list(self._incoming)})

    def clients_running(self) -> set[str]:
        return set(dict(self._waiting.running))

    def estimate(self, prompt_tokens: int, client: str = "", level: int = 0) -> Estimate:
        """When a request of ``prompt_tokens`` (after prefix reuse) from ``client`` at
        priority ``level`` would get its first token, given the queue and the running
        batch, and whether it has to wait for a slot (llm/ttft_estimate.py), calibrated by
        the error of earlier estimates (llm/calibration.py). Read without a lock."""
        running = list(self._running)
        by_line = {(lv, c): reqs for lv, c, reqs in self._waiting.snapshot()}
        for r in list(self._incoming):  # one line a client, as the waiting room will hold them
            by_line.setdefault((r.level, r.client), []).append(r)
        lines = [(lv, c, reqs) for (lv, c), reqs in by_line.items()]
        held = dict(self._waiting.running)
        queued = sorted(ahead_of(lines, client, level, held), key=lambda r: r.arrival)
        short = len(running) + len(queued) + 1 - self.max_sequences
        preempts = short > 0 and self.preemption.would_preempt(client, level, running, self._waiting)
        learned = (self.mean_output, self.costs, self.budget, self.cached)  # outputs, steps, prefixes
        raw, case = first_token_wait(prompt_tokens, running, queued, self.max_sequences, preempts, *learned)
        return Estimate(raw * self.calibration.factor(case), raw, case)

    def fair_claim(self, client: str) -> bool:
        """Whether ``client`` holds fewer slots than its share while another client holds
        more (llm.admission.fair_claim): a snapshot."""
        clients = self._waiting.clients() | {r.client for r in list(self._incoming)}
        return fair_claim(client, dict(self._waiting.running), clients, self.max_sequences)

    def queue_length(self) -> int:
        """Requests waiting, less those evicted and not yet dropped."""
        return len(self._waiting) + len(self._incoming) - len(self._evicted)

    def evictable(self, client: str, share: int) -> GenRequest | None:
        """The waiting request to evict from a full queue so that ``client`` gets in, if any
        (llm.admission.evictable): a snapshot, read on the event loop."""
        waiting = [r for _, _, reqs in self._waiting.snapshot() for r in reqs]
        return evictable([*waiting, *list(self._incoming)], client, share, self._suspended)

    def evict(self, req: GenRequest, why: str) -> None:
        """Drop a waiting request (``evictable``): it ends as refused, with ``why``."""
        req.refused = why
        self._evicted.add(req)
        self.cancel(req)

    def cached(self, prompt: list[int]) -> int:
        """Prompt tokens whose KV a new request could reuse now (a kept slot or a prefix
        slot). Read from the event loop too: a snapshot, no lock."""
        return self.slots.cached(prompt)

    # ---- engine thread ----
    def warmup(self) -> None:
        """Seed the step costs and the thread choice (llm/warmup.py; called before start)."""
        warm_up(self.model, self.threads_one, self.threads, self.costs)

    def _loop(self) -> None:
        try:
            self.warmup()
        except BaseException as exc:
            self._started.set_exception(exc)
            return
        self._started.set_result(None)
        try:
            while not self._stop:
                if not self._running and not self._waiting and not self._incoming:
                    self._wake.wait()
                    self._wake.clear()
                    continue
                self._step()
        except Exception:  # a bug or a broken engine: fail every request, then stop
            log.exception("the generation engine stopped")
            for s in self._running:
                s.req.emit(Event("", 0, "error", "the generation engine failed (logged)"))
            for r in (*self._waiting.drain(), *self._incoming):
                r.emit(Event("", 0, "error", "the generation engine failed (logged)"))
            self._running.clear()
            self._incoming.clear()
        finally:
            for s in self._running:
                s.req.emit(Event("", 0, "abort", "the model is unloading"))
                self.model.free_sampler(s.sampler)
            for r in (*self._waiting.drain(), *self._incoming):
                r.emit(Event("", 0, "abort", "the model is unloading"))
            self._suspended.clear(self.model)

    def _step(self) -> None:
        """One step, in five phases (the module's docstring): each a method below."""
        now = time.perf_counter()
        urgent = self._take_cancellations(now)
        self._admit_waiting(now)
        if not self._running:
            return
        step = self._plan(urgent)
        t1 = self._decode(step)
        if t1 is not None:
            self._sample(step, t1)

    def _take_cancellations(self, now: float) -> int | None:
        """Phase 1: the requests submitted since the last step join the waiting room; the
        sequences and waiting requests whose client left are freed at once. Returns the
        best priority level that asked to stop the last step (submit), if any."""
        while self._incoming:
            self._waiting.push(self._incoming.popleft())
        urgent, self._urgent = self._urgent, None
        self.model.interrupt(False)
        if any(s.req.cancelled for s in self._running):
            for s in [s for s in self._running if s.req.cancelled]:
                self._finish(s, "abort", now)
        if self._cancels:
            self._cancels = False
            for r in self._waiting.take_cancelled():
                self._drop_waiting(r)
        return urgent

    def _admit_waiting(self, now: float) -> None:
        """Phase 2: waiting requests take the free slots, priority then fairness
        (llm/admission.py); preemption makes room where the policy says so."""
        while self._waiting and self.slots.free:
            self._admit(self._waiting.pop(), now)  # type: ignore[arg-type]
        while self._waiting and not self.slots.free and self._preempt(now):
            self._admit(self._waiting.pop(), now)  # type: ignore[arg-type]

    def _plan(self, urgent: int | None) -> PlannedStep:
        """Phase 3: the step's batch (``step_plan.plan_step``): each decoding sequence's last
        token and drafts, then prompt chunks; an ``urgent`` prompt alone."""
        n_ctx = self.model.n_ctx_seq
        return plan_step(self._running, urgent, self.drafter, self.budget, self.speculate_below, n_ctx)

    def _decode(self, step: PlannedStep) -> float | None:
        """Phase 4: one ``llama_decode`` of the batch (it releases the GIL), on the thread
        count that has been fastest for its size. Returns when it ended, or None when it
        did not run (a burst to take in, an interrupt, a failure: its sequences failed)."""
        m = self.model
        batch = step.batch
        tokens, logits, plan, prefill = batch.tokens, batch.logits, batch.plan, batch.prefill
        n_tok = len(tokens)
        choice = self.threads if n_tok > 1 else self.threads_one
        threads = choice.pick(n_tok, self.budget.itl_target_s())
        m.set_threads(threads, threads)
        t0 = time.perf_counter()
        # prompts only (not a prompt run alone for priority): a request arriving in the first
        # half of the step stops it to join (JoinWindow); one that arrived while it was
        # planned is taken into it, planned again (docs/design.md: a burst split in two)
        joinable = not plan and not step.alone
        half = 0.5 * n_tok * self.costs.prefill_token_s
        self._join.begin(t0, half if joinable and m.interruptible else None)
        if joinable and self._incoming and self._room():
            self._join.end()
            return None
        try:
            ran = m.decode(tokens, batch.pos, batch.seqs, logits)
        except Exception as exc:
            log.error("decode of a step of %d tokens failed: %s", len(tokens), exc)
            for s in list(self._running):
                if s.req.cancelled or any(s is p[0] for p in plan) or any(s is p[0] for p in prefill):
                    self._finish(s, "error", time.perf_counter(), f"the engine failed: {exc}")
            return None
        finally:
            self._join.end()
        if not ran:  # interrupted (submit): nothing of it happened; the next step runs
            self.stats.interrupted += 1
            return None
        t1 = time.perf_counter()
        choice.record(n_tok, threads, (t1 - t0) / n_tok)
        wanted = sum(logits)
        self.costs.learn(t1 - t0, wanted, n_tok - wanted, sum(len(d) for _, _, d in plan))
        self.stats.steps += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "step: %d decoding (%d drafts), %d prompt tokens of %d prompts, %d waiting, %d threads: "
                "%.1f ms",
                len(plan),
                sum(len(d) for _, _, d in plan),
                n_tok - len(plan) - sum(len(d) for _, _, d in plan),
                len(prefill),
                len(self._waiting) + len(self._incoming),
                threads,
                (t1 - t0) * 1e3,
            )
        return t1

    def _sample(self, step: PlannedStep, t1: float) -> None:
        """Phase 5: prefill progress and first tokens; each decoding sequence's token(s)
        sampled and its drafts verified; text out, and the sequences that finished end."""
        m = self.model
        for s, n, at in step.batch.prefill:
            s.prefilled += n
            s.n_past += n
            if at >= 0 and not s.req.cancelled:
                self.slots.prefilled(s.slot, s.req.prompt, t1)
                self._emit_tokens(s, [m.sample(s.sampler, at)], t1)
        for s, i0, drafts in step.batch.plan:
            if not s.req.cancelled:
                out = self.drafter.verify(m, s, i0, drafts, step.looked.get(s.slot, ()))
                self._emit_tokens(s, out, t1)

    def _drop_waiting(self, r: GenRequest) -> None:
        self._suspended.drop(r, self.model)  # a suspended sequence whose client left
        if r.refused:  # evicted for a newcomer (evict)
            self._evicted.discard(r)
            self.stats.ended("refused")
            r.emit(Event("", 0, "refused", r.refused))
            return
        self.stats.ended("abort")
        r.emit(Event("", 0, "abort"))

    def _preempt(self, now: float) -> bool:
        """Suspend the running sequence the preemption policy names for the head of the
        queue, if any: its KV goes to host memory and its slot is free."""
        head = self._waiting.head()
        if head is None:
            return False
        s = self.preemption.victim(head, self._running, self._waiting)
        if s is None:
            return False
        if not self._suspended.hold(s, self.model.save_seq(s.slot)):
            return False
        self._running.remove(s)
        self.slots.release(s.slot)
        self._waiting.ended(s.req.client)
        self._waiting.push(s.req, front=True)
        self.stats.preempted += 1
        return True

    def _resume(self, s: Sequence, data: bytes, now: float) -> None:
        """A suspended sequence takes a free slot again, its KV (``data``) restored from
        host memory."""
        m = self.model
        slot = self.slots.take_empty(s.history[: s.n_past], self._running, now)
        if not m.load_seq(slot, data):
            log.error("restoring a suspended sequence's %d tokens failed", s.n_past)
            self.slots.release(slot)
            m.free_sampler(s.sampler)
            self.stats.ended("error")
            s.req.emit(Event("", 0, "error", "the sequence could not be resumed after preemption"))
            return
        s.slot = slot
        s.ran_from = s.generated
        self._running.append(s)
        self._waiting.started(s.req.client)

    def _admit(self, req: GenRequest, now: float) -> None:
        suspended = self._suspended.take(req)
        if suspended is not None:
            self._resume(*suspended, now)
            return
        m = self.model
        try:
            sampler = m.new_sampler(req.sampler)
        except Exception as exc:  # its request fails, not the engine and every other request
            log.error("a sampler could not be built: %s", exc)
            req.emit(Event("", 0, "error", f"the sampler could not be built: {exc}"))
            return
        slot = self.slots.take(req.prompt, self._running)
        reused = self.slots.start(slot, req.prompt, now)
        if req.penalties:
            for t in req.prompt:
                m.accept(sampler, t)
        s = Sequence(req, slot, sampler, reused, now)
        self._running.append(s)
        self._waiting.started(req.client)
        self.stats.admitted(len(req.prompt), reused, now - req.arrival)
        log.debug(
            "admitted to slot %d: %d prompt tokens, %d cached, after %.1f ms",
            slot,
            len(req.prompt),
            reused,
            (now - req.arrival) * 1e3,
        )

    def _emit_tokens(self, s: Sequence, new: list[int], now: float) -> None:
        """Account ``new`` sampled tokens to ``s``: text out, finish on EOS, stop, length."""
        req = s.req
        out, used, finish = s.take(new, self.model)
        st = self.stats
        st.output_tokens += used
        if s.first_at == 0.0:
            s.first_at = now
            st.first_token(now - req.arrival, cold=req.load_s > 0.0)  # its model loaded for it
            if req.estimate > 0.0:  # what admission expected: learn its error
                self.calibration.learn(now - req.arrival, req.estimate_raw, req.case)
                st.ttft_ratio_hist.observe((now - req.arrival) / req.estimate)
        else:
            st.next_tokens((now - s.last_at) / used, used)
        s.last_at = now
        if finish is None:
            if out or used:
                req.emit(Event(out, used))
            return
        if out:
            req.emit(Event(out, used))
            used = 0
        self._finish(s, finish, now, tokens=used)

    def _finish(
        self, s: Sequence, reason: str, now: float, error: str | None = None, tokens: int = 0
    ) -> None:
        m = self.model
        self._running.remove(s)
        self._waiting.ended(s.req.client)
        # kept for a prompt that begins the same way (on error, the step's KV writes are void)
        self.slots.release(s.slot, None if reason == "error" else s.history[: s.n_past])
        if reason != "error":
            self.drafter.memory.add(s.req.prompt, s.history[len(s.req.prompt) :])
        m.free_sampler(s.sampler)
        req = s.req
        if req.refused:  # evicted (evict) just as it was admitted: it ends as refused
            self._evicted.discard(req)
            if reason == "abort":
                reason, error = "refused", req.refused
        st = self.stats
        self.stats.ended(reason)
        if reason in ("stop", "length"):
            self.mean_output = 0.9 * self.mean_output + 0.1 * s.generated
        st.e2e_hist.observe(now - req.arrival)
        st.output_tokens_hist.observe(s.generated)
        req.emit(Event("", tokens, reason, error, s.usage(), s.timing(now)))
