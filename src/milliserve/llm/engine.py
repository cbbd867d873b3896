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

import codecs
import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from milliserve.runtime.stats import GenerationStats

__all__ = ["Engine", "Event", "GenRequest", "ThreadChoice", "TokenModel"]

log = logging.getLogger(__name__)


class TokenModel(Protocol):
    """The token-level operations the engine uses (``backends.llama_cpp.LlamaModel``)."""

    n_ctx_seq: int
    batch_capacity: int
    threads: tuple[int, int]

    def set_threads(self, n: int, n_batch: int) -> None: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> None: ...

    def new_sampler(self, spec: Any) -> Any: ...

    def accept(self, sampler: Any, token: int) -> None: ...

    def sample(self, sampler: Any, index: int) -> int: ...

    def free_sampler(self, sampler: Any) -> None: ...

    def seq_remove(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_copy(self, src: int, dst: int, keep: int) -> None: ...


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


class _Seq:
    """A request that holds a sequence slot."""

    __slots__ = (
        "accept_rate",
        "accept_run",
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
        "req",
        "sampler",
        "slot",
        "stop_len",
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
        self.accept_rate = 1.0
        self.accept_run = 3.0  # drafted tokens accepted per verifying step (EWMA)

    def push_history(self, token: int) -> None:
        self.index.setdefault(token, []).append(len(self.history))
        self.history.append(token)


@dataclass(slots=True)
class _Prefix:
    slot: int
    tokens: list[int]
    used_at: float


class ThreadChoice:
    """How many threads a step of several tokens uses: ``n_threads_batch`` (the config's
    choice) unless the other count (``n_threads``) has measured at least 10% faster per
    token, over at least 3 steps of the same size, lately. On a machine shared with other
    work, llama.cpp's threads can spin against the other processes and two threads can be
    slower than one; which is faster changes with the load, so every
    ``explore_every``-th step of a size tries the other count."""

    def __init__(self, low: int, high: int, explore_every: int = 16) -> None:
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
        if step % self.explore_every == 0 or (step <= 3 * self.explore_every and step % 4 == 0):
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


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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
        draft_tokens: int = 0,
        speculate_below: int = 0,
        stats: GenerationStats | None = None,
        itl_budget_s: float | None = None,
        name: str = "llm",
        spawn: Callable[[str, Callable[[], None]], threading.Thread] | None = None,
    ) -> None:
        self.model = model
        self.max_sequences = max_sequences
        self.step_tokens = step_tokens
        self.min_prefix = min_prefix_tokens
        self.draft_tokens = draft_tokens
        self.speculate_below = speculate_below
        self.itl_budget_s = itl_budget_s
        self.stats = stats or GenerationStats()
        self._free = list(range(max_sequences))  # a heap: the lowest free slot first
        self._prefixes: list[_Prefix] = []
        self._prefix_free = list(range(max_sequences + prefix_slots - 1, max_sequences - 1, -1))
        self._running: list[_Seq] = []
        self._waiting: deque[GenRequest] = deque()
        self._incoming: deque[GenRequest] = deque()
        self._wake = threading.Event()
        self._stop = False
        # estimates, seeded by warmup(): seconds of a decode-only step, seconds per prefill token
        self.step_s = 0.02
        self.prefill_token_s = 0.003
        self.mean_output = 128.0  # tokens a finished request generated, on average (EWMA)
        self.single_threads, batch_threads = model.threads
        self.threads = ThreadChoice(self.single_threads, batch_threads)
        self.stats.running = lambda: len(self._running)
        self.stats.waiting = lambda: len(self._waiting) + len(self._incoming)
        self.stats.kv_tokens = lambda: sum(s.n_past for s in self._running)
        self.stats.kv_capacity = max_sequences * model.n_ctx_seq
        make = spawn or (lambda n, f: threading.Thread(target=f, name=n, daemon=True))
        self._thread = make(f"ms-engine-{name}", self._loop)

    # ---- event-loop side ----
    def start(self) -> None:
        self._thread.start()

    def submit(self, req: GenRequest) -> None:
        self._incoming.append(req)
        self._wake.set()

    def cancel(self, req: GenRequest) -> None:
        req.cancelled = True
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

    def prefix_hit(self, prompt: list[int]) -> int:
        """Prompt tokens a cached prefix would spare (an estimate: read without a lock)."""
        best = 0
        for p in list(self._prefixes):
            n = _common_prefix(p.tokens, prompt)
            if n >= self.min_prefix and n > best:
                best = n
        return min(best, len(prompt) - 1)

    def estimate_ttft(self, prompt_tokens: int) -> float:
        """Seconds until a request of ``prompt_tokens`` (after prefix reuse) would get its
        first token, given the queue and the running batch. Read without a lock.

        The prompts ahead count net of the prefix cache; when every slot is taken, a slot
        frees when the soonest running sequence ends, expected after the usual output length
        (learned from finished requests) or its ``max_tokens``, whichever is first."""
        running = list(self._running)
        queued = list(self._waiting) + list(self._incoming)
        ahead = sum(
            len(r.prompt) - (self.prefix_hit(r.prompt) if i < 64 else 0) for i, r in enumerate(queued)
        )
        ahead += sum(len(s.req.prompt) - s.prefilled for s in running)
        decoding = sum(1 for s in running if s.prefilled == len(s.req.prompt))
        wait = 0.0
        short = len(running) + len(queued) + 1 - self.max_sequences
        if short > 0:  # a slot must free first: the short-th soonest finisher
            typical = self.mean_output
            left = sorted(max(1.0, min(s.req.max_tokens, typical) - s.generated) for s in running)
            wait = left[min(short, len(left)) - 1] * self.step_s if left else 0.0
        tokens = ahead + prompt_tokens
        steps = -(-tokens // max(1, self._prefill_budget(decoding)))
        return wait + steps * self.step_s + tokens * self.prefill_token_s

    # ---- engine thread ----
    def warmup(self) -> None:
        """Seed the estimates with one prefill and a few decode steps (called before start)."""
        m = self.model
        slot = 0
        prompt = [1] * 32
        t0 = time.perf_counter()
        m.decode(prompt, list(range(32)), [slot] * 32, [False] * 31 + [True])
        self.prefill_token_s = (time.perf_counter() - t0) / 32
        t = []
        for i in range(3):
            t0 = time.perf_counter()
            m.decode([1], [32 + i], [slot], [True])
            t.append(time.perf_counter() - t0)
        self.step_s = min(t)
        m.seq_remove(slot)

    def _prefill_budget(self, decoding: int) -> int:
        budget = self.step_tokens - decoding
        if self.itl_budget_s is not None and decoding:
            # keep a step (and so the time between tokens of the running sequences) in budget;
            # with nothing decoding there is no stream to stall
            fit = int((self.itl_budget_s * 0.8 - self.step_s) / max(self.prefill_token_s, 1e-6))
            budget = min(budget, max(16, fit))
        return max(1, budget)

    def _loop(self) -> None:
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
            for r in (*self._waiting, *self._incoming):
                r.emit(Event("", 0, "error", "the generation engine failed (logged)"))
            self._running.clear()
            self._waiting.clear()
            self._incoming.clear()
        finally:
            for s in self._running:
                s.req.emit(Event("", 0, "abort", "the model is unloading"))
                self.model.free_sampler(s.sampler)
            for r in (*self._waiting, *self._incoming):
                r.emit(Event("", 0, "abort", "the model is unloading"))

    def _step(self) -> None:
        m = self.model
        now = time.perf_counter()
        while self._incoming:
            self._waiting.append(self._incoming.popleft())
        # cancellations: free at once
        if any(s.req.cancelled for s in self._running):
            for s in [s for s in self._running if s.req.cancelled]:
                self._finish(s, "abort", now)
        if any(r.cancelled for r in self._waiting):
            for r in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(r)
                self._count("abort")
                r.emit(Event("", 0, "abort"))
        # admission
        while self._waiting and self._free:
            self._admit(self._waiting.popleft(), now)
        if not self._running:
            return
        # the batch. With one KV buffer per sequence, llama.cpp splits a batch into micro-batches
        # of sequences whose ids follow each other (0, 1, 2, ...) in batch order, each one
        # more pass over the weights: the entries go in slot order, and slots are handed out
        # lowest first, so that a step is one pass (two when a prompt chunk is longer).
        decoding = [s for s in self._running if s.prefilled == len(s.req.prompt)]
        speculate = self.draft_tokens > 0 and len(decoding) < self.speculate_below
        feed: dict[int, list[int]] = {}  # slot -> tokens this step (decoding: last + drafts)
        drafts_of: dict[int, list[int]] = {}
        for s in decoding:
            drafts = self._draft(s) if speculate and s.req.speculate else []
            drafts_of[s.slot] = drafts
            feed[s.slot] = [s.last, *drafts]
        budget = self._prefill_budget(sum(len(f) for f in feed.values()))
        chunk: dict[int, int] = {}  # slot -> prompt tokens prefilled this step (oldest first)
        for s in self._running:
            left = len(s.req.prompt) - s.prefilled
            if left <= 0 or budget <= 0:
                continue
            chunk[s.slot] = n = min(left, budget)
            budget -= n
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        logits: list[bool] = []
        plan: list[tuple[_Seq, int, list[int]]] = []  # (seq, first index, drafts) of decoding seqs
        prefill: list[tuple[_Seq, int, int]] = []  # (seq, chunk length, logits index or -1)
        for s in sorted(self._running, key=lambda x: x.slot):
            if s.slot in feed:
                plan.append((s, len(tokens), drafts_of[s.slot]))
                for j, t in enumerate(feed[s.slot]):
                    tokens.append(t)
                    pos.append(s.n_past + j)
                    seqs.append(s.slot)
                    logits.append(True)
            elif s.slot in chunk:
                n = chunk[s.slot]
                done = s.prefilled + n == len(s.req.prompt)
                for i in range(s.prefilled, s.prefilled + n):
                    tokens.append(s.req.prompt[i])
                    pos.append(i)
                    seqs.append(s.slot)
                    logits.append(False)
                if done:
                    logits[-1] = True
                prefill.append((s, n, len(tokens) - 1 if done else -1))
        n_tok = len(tokens)
        threads = self.threads.pick(n_tok) if n_tok > 1 else self.single_threads
        if n_tok > 1:
            m.set_threads(self.single_threads, threads)
        t0 = time.perf_counter()
        try:
            m.decode(tokens, pos, seqs, logits)
        except Exception as exc:
            log.error("decode of a step of %d tokens failed: %s", len(tokens), exc)
            for s in list(self._running):
                if s.req.cancelled or any(s is p[0] for p in plan) or any(s is p[0] for p in prefill):
                    self._finish(s, "error", time.perf_counter(), f"the engine failed: {exc}")
            return
        t1 = time.perf_counter()
        if n_tok > 1:
            self.threads.record(n_tok, threads, (t1 - t0) / n_tok)
        self._learn(t1 - t0, len(tokens), len(decoding), sum(n for _, n, _ in prefill))
        self.stats.steps += 1
        # prefill progress and first tokens
        for s, n, at in prefill:
            s.prefilled += n
            s.n_past += n
            if at >= 0 and not s.req.cancelled:
                self._remember_prefix(s, t1)
                self._emit_tokens(s, [m.sample(s.sampler, at)], t1)
        # decoding sequences: sample, verify drafts
        for s, i0, drafts in plan:
            if s.req.cancelled:
                continue
            out: list[int] = []
            for j in range(len(drafts) + 1):
                t = m.sample(s.sampler, i0 + j)
                out.append(t)
                if j < len(drafts) and t == drafts[j]:
                    continue
                break
            s.n_past += len(out)  # s.last and the accepted drafts are now in the KV cache
            if drafts:
                s.drafted += len(drafts)
                s.accepted += len(out) - 1
                self.stats.draft_tokens += len(drafts)
                self.stats.accepted_tokens += len(out) - 1
                s.accept_rate = 0.7 * s.accept_rate + 0.3 * ((len(out) - 1) / len(drafts))
                s.accept_run = 0.6 * s.accept_run + 0.4 * (len(out) - 1)
                if len(out) - 1 < len(drafts):
                    m.seq_remove(s.slot, s.n_past, -1)  # the rejected drafts' KV
            self._emit_tokens(s, out, t1)

    def _learn(self, dt: float, n_tokens: int, decoding: int, prefilled: int) -> None:
        if prefilled == 0:
            self.step_s = 0.8 * self.step_s + 0.2 * dt
        elif prefilled >= 16:
            per = max(0.0, dt - self.step_s) / prefilled
            self.prefill_token_s = 0.8 * self.prefill_token_s + 0.2 * per

    def _admit(self, req: GenRequest, now: float) -> None:
        m = self.model
        slot = heapq.heappop(self._free)
        reused = 0
        best: _Prefix | None = None
        for p in self._prefixes:
            n = _common_prefix(p.tokens, req.prompt)
            if n >= self.min_prefix and n > reused:
                best, reused = p, n
        reused = min(reused, len(req.prompt) - 1)  # the last prompt token is decoded for logits
        if best is not None and reused >= self.min_prefix:
            m.seq_copy(best.slot, slot, reused)
            best.used_at = now
        else:
            reused = 0
        sampler = m.new_sampler(req.sampler)
        if req.penalties:
            for t in req.prompt:
                m.accept(sampler, t)
        s = _Seq(req, slot, sampler, reused, now)
        self._running.append(s)
        st = self.stats
        st.prompt_tokens += len(req.prompt)
        st.cached_prompt_tokens += reused
        st.prompt_tokens_hist.observe(len(req.prompt))
        st.queue_hist.observe(now - req.arrival)

    def _remember_prefix(self, s: _Seq, now: float) -> None:
        """Keep this prompt's KV as a reusable prefix when no cached one shares enough of it."""
        if not self._prefixes and not self._prefix_free:
            return
        prompt = s.req.prompt
        if len(prompt) < self.min_prefix * 2:
            return
        for p in self._prefixes:
            if _common_prefix(p.tokens, prompt) >= self.min_prefix:
                return  # its family is cached
        if self._prefix_free:
            slot = self._prefix_free.pop()
        else:  # evict the least recently used
            old = min(self._prefixes, key=lambda p: p.used_at)
            self._prefixes.remove(old)
            slot = old.slot
        self.model.seq_copy(s.slot, slot, len(prompt))
        self._prefixes.append(_Prefix(slot, list(prompt), now))

    def _draft(self, s: _Seq) -> list[int]:
        """Prompt lookup: the tokens that followed the latest earlier occurrence of the
        sequence's last n tokens (n = 3, then 2), if any. As many as the sequence's recent
        acceptance makes worth verifying: while drafts are mostly accepted, half again the
        run the sequence has been accepting (up to ``draft_tokens``: a copy from the prompt
        accepts long runs, which pay most), two while some are, and none (with a retry
        every 8 tokens) while they keep failing."""
        rate = s.accept_rate
        if rate >= 0.5:
            want = max(2, min(self.draft_tokens, int(s.accept_run * 1.5) + 2))
        elif rate >= 0.2 or s.generated % 8 == 0:
            want = min(2, self.draft_tokens)
        else:
            return []
        h = s.history
        n_hist = len(h)
        room = min(want, s.req.max_tokens - s.generated - 1, self.model.n_ctx_seq - s.n_past - 2)
        if room <= 0 or n_hist < 3:
            return []
        cands = s.index.get(h[-1])
        if not cands or len(cands) < 2:
            return []
        for n in (3, 2):
            tail = h[n_hist - n :]
            for p in reversed(cands[:-1]):  # the last one is the current position
                if p - n + 1 < 0:
                    continue
                if h[p - n + 1 : p + 1] == tail:
                    return h[p + 1 : p + 1 + room]
        return []

    def _emit_tokens(self, s: _Seq, new: list[int], now: float) -> None:
        """Account ``new`` sampled tokens to ``s``: text out, finish on EOS, stop, length."""
        m = self.model
        req = s.req
        text = []
        finish: str | None = None
        used = 0
        for t in new:
            used += 1
            s.generated += 1
            if m.is_eog(t) and not req.ignore_eos:
                finish = "stop"
                break
            s.push_history(t)
            s.pending += s.dec.decode(m.piece(t))
            if s.stop_len:
                cut = min((i for i in (s.pending.find(x) for x in req.stop) if i >= 0), default=-1)
                if cut >= 0:
                    text.append(s.pending[:cut])
                    s.pending = ""
                    finish = "stop"
                    break
                keep = self._held_back(s.pending, req.stop)
                text.append(s.pending[: len(s.pending) - keep])
                s.pending = s.pending[len(s.pending) - keep :]
            else:
                text.append(s.pending)
                s.pending = ""
            if s.generated >= req.max_tokens or s.n_past + 1 >= m.n_ctx_seq:
                finish = "length"
                break
        s.last = new[used - 1]
        out = "".join(text)
        st = self.stats
        st.output_tokens += used
        if s.first_at == 0.0:
            s.first_at = now
            st.ttft_hist.observe(now - req.arrival)
        else:
            gap = (now - s.last_at) / used
            for _ in range(used):
                st.itl_hist.observe(gap)
        s.last_at = now
        if finish is None:
            if out or used:
                req.emit(Event(out, used))
            return
        if finish == "length":
            out += s.pending + s.dec.decode(b"", final=True)
            s.pending = ""
        if out:
            req.emit(Event(out, used))
            used = 0
        self._finish(s, finish, now, tokens=used)

    @staticmethod
    def _held_back(pending: str, stops: tuple[str, ...]) -> int:
        """Length of the longest end of ``pending`` that begins some stop string."""
        best = 0
        for x in stops:
            for k in range(min(len(x) - 1, len(pending)), best, -1):
                if x.startswith(pending[len(pending) - k :]):
                    best = k
                    break
        return best

    def _finish(self, s: _Seq, reason: str, now: float, error: str | None = None, tokens: int = 0) -> None:
        m = self.model
        self._running.remove(s)
        m.seq_remove(s.slot)
        m.free_sampler(s.sampler)
        heapq.heappush(self._free, s.slot)
        req = s.req
        st = self.stats
        self._count(reason)
        if reason in ("stop", "length"):
            self.mean_output = 0.9 * self.mean_output + 0.1 * s.generated
        st.e2e_hist.observe(now - req.arrival)
        st.output_tokens_hist.observe(s.generated)
        timing = {
            "queue_ms": (s.admitted - req.arrival) * 1e3,
            "ttft_ms": (s.first_at - req.arrival) * 1e3 if s.first_at else -1.0,
            "e2e_ms": (now - req.arrival) * 1e3,
        }
        usage = {
            "prompt_tokens": len(req.prompt),
            "completion_tokens": s.generated,
            "total_tokens": len(req.prompt) + s.generated,
            "cached_tokens": s.cached,
            "draft_tokens": s.drafted,
            "accepted_draft_tokens": s.accepted,
        }
        req.emit(Event("", tokens, reason, error, usage, timing))

    def _count(self, reason: str) -> None:
        f = self.stats.finished
        f[reason] = f.get(reason, 0) + 1
