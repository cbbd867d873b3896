"""llama.cpp backend for generative models: a version folder holds ``model.gguf``
(``platform: "llama_cpp"`` or ``backend: "llama_cpp"``).

This module is the only one that calls llama.cpp (through llama-cpp-python's ctypes
bindings, the low-level API only). It offers the token-level operations the
continuous-batching engine (``milliserve.llm.engine``) needs: tokenize, detokenize,
one ``llama_decode`` over a batch holding tokens of many sequences, per-sequence
samplers, and KV-cache edits (remove, copy). Like every backend it is blocking code
that knows nothing of asyncio; one engine thread owns a context. Its config ``parameters``
are read in ``milliserve.backends.llama_options``.

llama-cpp-python is an optional dependency: ``pip install 'milliserve[llm]'``.
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from milliserve.backends.base import GenerativeBackendFactory
from milliserve.backends.llama_grammar import SCHEMA_FIELD, GrammarCompiler, JsonConstraint, logits_view
from milliserve.backends.llama_options import (
    _GGML_TYPES,
    KNOWN_PARAMETERS,
    LlmOptions,
    parse_llm_options,
)
from milliserve.config.model_config import ModelConfig
from milliserve.errors import BackendError

__all__ = [
    "FACTORY",
    "KNOWN_PARAMETERS",
    "LlamaCppFactory",
    "LlamaModel",
    "LlmOptions",
    "SamplerSpec",
    "parse_llm_options",
]

INSTALL_HINT = "pip install 'milliserve[llm]'"
# llama.cpp log levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation; warnings and errors pass
_LOG_WARN = 3
# numpy views of logits rows kept (a row at each of a step's entries with logits, at most
# a batch's; dropped together when the output buffer has moved often enough to fill it)
MAX_ROW_VIEWS = 4096
# what llama.cpp logs when a step is interrupted on purpose (LlamaModel.interrupt)
_ABORTED = (b"with error 1", b"compute status: 1", b"ret = 2", b"removing memory module")
_init_lock = threading.Lock()
_initialised: dict[str, Any] = {}


def _llama(error: type[Exception] = BackendError) -> ModuleType:
    """llama-cpp-python's low-level module, with its log routed to ours (once)."""
    with _init_lock:
        if "module" in _initialised:
            found: ModuleType = _initialised["module"]
            return found
        try:
            mod = importlib.import_module("llama_cpp.llama_cpp")
        except ImportError as exc:
            raise error(f"the llama_cpp backend needs llama-cpp-python: {INSTALL_HINT} ({exc})") from None
        import logging

        log = logging.getLogger("milliserve.llama_cpp")

        @mod.llama_log_callback  # type: ignore[untyped-decorator]
        def _log(level: int, text: bytes, _user: Any) -> None:
            # 5: continuation of a line. An interrupted step (status 1, ABORTED) is not news
            if level >= _LOG_WARN and level != 5 and text and not any(m in text for m in _ABORTED):
                log.warning("llama.cpp: %s", text.decode(errors="replace").rstrip())

        mod.llama_log_set(_log, ctypes.c_void_p(0))
        mod.llama_backend_init()
        _initialised["module"] = mod
        _initialised["log"] = _log  # keep the callback alive
        return mod


@dataclass(frozen=True, slots=True)
class SamplerSpec:
    """How one sequence picks its tokens (OpenAI's names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # the JSON schema's grammar state (structured output), or None
    constraint: JsonConstraint | None = None

    @property
    def penalised(self) -> bool:
        """A repetition, frequency or presence penalty is asked for."""
        return self.repetition_penalty != 1.0 or bool(self.frequency_penalty or self.presence_penalty)


class _Greedy:
    """Greedy decoding and nothing else: the first highest logit, which is what llama.cpp's
    greedy sampler picks, read by numpy from the logits row. ``llama_sampler_sample`` first
    copies the whole vocabulary (49,152 candidates for SmolLM2) into an array, and took
    54-88 us a token where this takes 7-11 (docs/design.md)."""

    __slots__ = ()


GREEDY = _Greedy()


class _Constrained:
    """A sampler chain behind a grammar: the mask goes on the logits first."""

    __slots__ = ("chain", "constraint")

    def __init__(self, chain: Any, constraint: JsonConstraint) -> None:
        self.chain = chain
        self.constraint = constraint


class LlamaModel:
    """One GGUF model and one context with ``n_seq`` sequence slots. Not thread-safe: the
    engine thread is the only caller after ``__init__``."""

    def __init__(self, path: Path, options: LlmOptions, n_seq: int) -> None:
        C = self._C = _llama()
        if not path.is_file():
            raise BackendError(f"{path}: no such GGUF file")
        mp = C.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = options.extra_buffers
        model = C.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise BackendError(f"{path}: llama.cpp could not load this GGUF file")
        self.model = model
        self.vocab = C.llama_model_get_vocab(model)
        self.n_vocab = int(C.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(C.llama_model_n_ctx_train(model))
        self.n_seq = n_seq
        self.n_ctx_seq = options.n_ctx
        self.batch_capacity = max(
            options.step_tokens + options.max_sequences * (options.draft_tokens + 1), options.n_ctx
        )
        cp = C.llama_context_default_params()
        cp.n_ctx = options.n_ctx * n_seq
        cp.n_batch = self.batch_capacity
        cp.n_ubatch = min(512, self.batch_capacity)
        cp.n_seq_max = n_seq
        cp.n_threads = options.n_threads
        cp.n_threads_batch = options.n_threads_batch
        cp.kv_unified = options.kv_unified
        cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[options.flash_attn]
        cp.type_k = _GGML_TYPES[options.cache_type_k]
        cp.type_v = _GGML_TYPES[options.cache_type_v]
        cp.no_perf = True
        ctx = C.llama_init_from_model(model, cp)
        if not ctx:
            C.llama_model_free(model)
            raise BackendError(
                f"{path}: llama.cpp could not create a context of {n_seq} x {options.n_ctx} tokens"
            )
        self.ctx = ctx
        self.mem = C.llama_get_memory(ctx)
        self.threads = (options.n_threads, options.n_threads_batch)
        self._batch = C.llama_batch_init(self.batch_capacity, 0, 1)
        self._stop = ctypes.create_string_buffer(2)  # b"\1": the step in flight stops
        self.interruptible = self._stop_callback()
        self._piece = ctypes.create_string_buffer(256)
        # looked up once a token (``piece``, ``is_eog``) or a logits row's address (``_row``):
        # after a step's decode the caches are cold from the weights, and every Python object
        # touched costs misses (a numpy view made anew took 28 µs there, 2 warm)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._rows: dict[int, np.ndarray[Any, np.dtype[np.float32]]] = {}
        self._tok_buf = (C.llama_token * 4096)()
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.bos_text = self.token_text(int(C.llama_vocab_bos(self.vocab)))
        self.eos_text = self.token_text(int(C.llama_vocab_eos(self.vocab)))
        self.chat_template = self.meta("tokenizer.chat_template")
        self.description = self.meta("general.name") or path.stem
        ends = [int(C.llama_vocab_eos(self.vocab)), int(C.llama_vocab_eot(self.vocab))]
        self.grammars = GrammarCompiler(self.vocab, self.n_vocab, list(dict.fromkeys(ends)))

    # ---- metadata and text ----
    def meta(self, key: str) -> str | None:
        C = self._C
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = C.llama_model_meta_val_str(self.model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode(errors="replace")
            size = n + 1

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.piece(token, special=True).decode(errors="replace")

    def control_texts(self) -> list[str]:
        """The texts that become a token only where special tokens are parsed (llama.cpp's
        control and unknown tokens; user-defined ones are parsed either way)."""
        C = self._C
        mask = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN
        attr, vocab = C.llama_vocab_get_attr, self.vocab
        texts = (self.token_text(t) for t in range(self.n_vocab) if attr(vocab, t) & mask)
        return [t for t in texts if t]

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        C = self._C
        raw = text.encode()
        buf, cap = self._tok_buf, len(self._tok_buf)
        n = C.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
            if n < 0:
                raise BackendError("llama.cpp could not tokenize the prompt")
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        if not special:
            got = self._pieces.get(token)
            if got is not None:
                return got
        C = self._C
        buf = self._piece
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        out = buf.raw[:n]
        if not special:
            self._pieces[token] = out
        return out

    def is_eog(self, token: int) -> bool:
        got = self._eog.get(token)
        if got is None:
            got = self._eog[token] = bool(self._C.llama_vocab_is_eog(self.vocab, token))
        return got

    # ---- decoding ----
    def set_threads(self, n: int, n_batch: int) -> None:
        if (n, n_batch) != self.threads:
            self._C.llama_set_n_threads(self.ctx, n, n_batch)
            self.threads = (n, n_batch)

    def _stop_callback(self) -> bool:
        """llama.cpp asks a step's abort callback between the nodes of its graph. Ours is C's
        own ``strlen`` over a two-byte flag (0 runs on, 1 stops: its length is the answer), so
        a step pays a byte read per node, and no Python, no GIL. False where libc is not there."""
        try:
            strlen = ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value
            self._stop_fn = self._C.ggml_abort_callback(strlen)
            self._C.llama_set_abort_callback(
                self.ctx, self._stop_fn, ctypes.cast(self._stop, ctypes.c_void_p)
            )
        except (AttributeError, OSError, TypeError):
            return False
        return True

    def interrupt(self, stop: bool = True) -> None:
        """Stop the step in flight, or the next one (any thread): its ``decode`` returns False
        and llama.cpp takes its KV writes back. ``stop=False`` clears the flag."""
        self._stop[0] = b"\1" if stop else b"\0"

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> bool:
        """One ``llama_decode`` of ``len(tokens)`` entries (token, position, sequence, whether
        its logits are wanted). Logits of entry i are then read by ``sample(.., i)``. False if
        the step was interrupted (``interrupt``): nothing of it happened."""
        b = self._batch
        n = len(tokens)
        if n > self.batch_capacity:
            raise BackendError(f"a step of {n} tokens is over the batch capacity {self.batch_capacity}")
        tok, ps, nseq, sid, lg = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i in range(n):
            tok[i] = tokens[i]
            ps[i] = pos[i]
            nseq[i] = 1
            sid[i][0] = seqs[i]
            lg[i] = logits[i]
        b.n_tokens = n
        rc = self._C.llama_decode(self.ctx, b)
        if rc == 2:
            # interrupted. llama.cpp took back the micro-batch it stopped in; those before it
            # (a step is split by runs of sequence ids) stay in the KV cache: take the step back
            first: dict[int, int] = {}
            for s, p in zip(seqs, pos, strict=True):
                first[s] = min(p, first.get(s, p))
            for s, p in first.items():
                self.seq_remove(s, p, -1)
            return False
        if rc != 0:
            # 1: no KV slot for the batch; <0: error. Either way the step's KV writes are void.
            raise BackendError(f"llama_decode failed with code {rc} on a step of {n} tokens")
        return True

    # ---- sampling ----
    def _chain(self, spec: SamplerSpec) -> Any:
        C = self._C
        sp = C.llama_sampler_chain_default_params()
        sp.no_perf = True
        chain = C.llama_sampler_chain_init(sp)
        add = C.llama_sampler_chain_add
        if spec.penalised:
            add(
                chain,
                C.llama_sampler_init_penalties(
                    self.n_vocab, 64, spec.repetition_penalty, spec.frequency_penalty, spec.presence_penalty
                ),
            )
        if spec.temperature <= 0.0:
            add(chain, C.llama_sampler_init_greedy())
            return chain
        if spec.top_k > 0:
            add(chain, C.llama_sampler_init_top_k(spec.top_k))
        if spec.top_p < 1.0:
            add(chain, C.llama_sampler_init_top_p(spec.top_p, 1))
        add(chain, C.llama_sampler_init_temp(spec.temperature))
        seed = C.LLAMA_DEFAULT_SEED if spec.seed is None else spec.seed & 0xFFFFFFFF
        add(chain, C.llama_sampler_init_dist(seed))
        return chain

    def new_sampler(self, spec: SamplerSpec) -> Any:
        if spec.temperature <= 0.0 and spec.constraint is None and not spec.penalised:
            return GREEDY
        chain = self._chain(spec)
        return chain if spec.constraint is None else _Constrained(chain, spec.constraint)

    def compile_schema(
        self, schema: dict[str, Any], field: str = SCHEMA_FIELD, param: str = "response_format"
    ) -> JsonConstraint:
        """A constraint for one request's JSON schema (RequestError naming the request's
        ``field`` and the part that does not compile). Thread-safe; blocking for about a
        millisecond."""
        return self.grammars.compile(schema, field, param)

    def accept(self, sampler: Any, token: int) -> None:
        """Feed a prompt token to the sampler's history (for the repetition penalties)."""
        if sampler is GREEDY:
            return
        chain = sampler.chain if sampler.__class__ is _Constrained else sampler
        self._C.llama_sampler_accept(chain, token)

    def _row(self, index: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        """Batch entry ``index``'s logits: a numpy view of llama.cpp's row, made once for
        each address it hands out (its output buffer moves only when a step wants more rows
        than it holds). With a view made each time, sampling after a one-token decode took
        43 µs here; with the view kept, 26."""
        addr = ctypes.cast(self._C.llama_get_logits_ith(self.ctx, index), ctypes.c_void_p).value
        if not addr:
            raise BackendError(f"llama.cpp has no logits for batch entry {index}")
        row = self._rows.get(addr)
        if row is None:
            if len(self._rows) >= MAX_ROW_VIEWS:
                self._rows.clear()
            row = self._rows[addr] = logits_view(addr, self.n_vocab)
        return row

    def sample(self, sampler: Any, index: int) -> int:
        """Pick a token from the logits of batch entry ``index`` (and accept it)."""
        C = self._C
        if sampler is GREEDY:
            return int(self._row(index).argmax())
        if sampler.__class__ is _Constrained:
            constraint = sampler.constraint
            constraint.mask(self._row(index))
            token = int(C.llama_sampler_sample(sampler.chain, self.ctx, index))
            constraint.accept(token)
            return token
        return int(C.llama_sampler_sample(sampler, self.ctx, index))

    def free_sampler(self, sampler: Any) -> None:
        if sampler is GREEDY:
            return
        self._C.llama_sampler_free(sampler.chain if sampler.__class__ is _Constrained else sampler)

    # ---- KV cache ----
    def seq_remove(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Drop sequence ``seq``'s KV in [p0, p1) (-1: open ends)."""
        return bool(self._C.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_copy(self, src: int, dst: int, keep: int) -> None:
        """Make ``dst`` hold the first ``keep`` positions of ``src``'s KV."""
        C = self._C
        C.llama_memory_seq_rm(self.mem, dst, -1, -1)
        C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        C.llama_memory_seq_rm(self.mem, dst, keep, -1)

    def save_seq(self, seq: int) -> bytes:
        """Sequence ``seq``'s KV (its cells, compact) as bytes, for ``load_seq``."""
        C = self._C
        size = int(C.llama_state_seq_get_size(self.ctx, seq))
        buf = (ctypes.c_ubyte * size)()
        n = int(C.llama_state_seq_get_data(self.ctx, buf, size, seq))
        return bytes(memoryview(buf)[:n])

    def load_seq(self, seq: int, data: bytes) -> bool:
        """Put KV saved by ``save_seq`` into sequence ``seq`` (emptied first)."""
        C = self._C
        C.llama_memory_seq_rm(self.mem, seq, -1, -1)
        buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        return int(C.llama_state_seq_set_data(self.ctx, buf, len(data), seq)) > 0

    def close(self) -> None:
        C = self._C
        self._rows.clear()  # views of the context's memory
        if self.ctx:
            C.llama_batch_free(self._batch)
            C.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            C.llama_model_free(self.model)
            self.model = None


class LlamaCppFactory(GenerativeBackendFactory):
    """The registry's entry for GGUF models: a generative engine (backends/base.py), so
    the repository builds a ``GenerativeServable`` around ``load_model``."""

    name = "llama_cpp"
    platforms = ("llama_cpp",)
    model_filename = "model.gguf"

    def options(self, config: ModelConfig) -> LlmOptions:
        return parse_llm_options(config)

    def load_model(self, model_path: Path, options: LlmOptions, n_seq: int) -> LlamaModel:
        return LlamaModel(model_path, options, n_seq)


FACTORY = LlamaCppFactory()
