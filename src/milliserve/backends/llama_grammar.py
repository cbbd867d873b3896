"""Structured output for the llama.cpp backend: a JSON schema becomes a token mask.

llguidance compiles the schema into a grammar over the model's own vocabulary (read
from llama.cpp's vocab, special tokens marked), and at every sampled position of a
constrained sequence computes which tokens may come next; the others' logits are set
to -inf before the sequence's sampler chain runs, and the sampled token is fed back to
the matcher. The grammar belongs to the sequence, so a constrained sequence decodes in
the same batch as the others: only its sampling differs.

llguidance was chosen over llama.cpp's own GBNF grammar sampler by measurement
(benchmarks/llm.py, "structured output"): on SmolLM2-135M's 49k-token vocabulary the
GBNF sampler took 5.4 ms a token (it walks every candidate through the grammar), more
than a whole decode step at one stream; llguidance's mask took 0.45 ms.

A schema that cannot be compiled is a ``RequestError`` naming the part (a JSON pointer)
that fails; limits on the grammar's size and on the work per token keep a hostile
schema from costing more than its own request.
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from milliserve.errors import MissingDependencyError, RequestError

__all__ = ["SCHEMA_FIELD", "GrammarCompiler", "JsonConstraint"]

log = logging.getLogger(__name__)

# compact JSON, as OpenAI's answers are: fewer tokens than pretty-printed
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# subschemas tried when looking for the part of a schema that fails
_MOST_PARTS = 256
_CACHED_GRAMMARS = 128
# the request field a schema came from, named in errors (tools name their own)
SCHEMA_FIELD = "response_format.json_schema.schema"


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise MissingDependencyError(
            f"structured output needs llguidance: pip install 'milliserve[llm]' ({exc})"
        ) from None
    return llguidance


class JsonConstraint:
    """The grammar state of one sequence. ``mask(logits)`` before sampling,
    ``accept(token)`` after; both on the engine thread."""

    __slots__ = ("_bits", "_eos", "matcher")

    def __init__(self, matcher: Any, n_vocab: int, eos: list[int]) -> None:
        self.matcher = matcher
        self._bits = np.zeros((n_vocab + 31) // 32, np.int32)
        self._eos = eos

    def mask(self, logits: np.ndarray[Any, np.dtype[np.float32]]) -> None:
        """Set the logits of the tokens the grammar does not allow now to -inf."""
        m = self.matcher
        if m.is_error() or m.is_stopped():
            keep = logits[self._eos].copy()
            logits[:] = -np.inf
            logits[self._eos] = keep  # the grammar is done (or broken): only the end remains
            return
        bits = self._bits
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[: logits.shape[0]]
        if not allowed.any():  # a dead end (bounds that admit no value): end here
            log.warning("the grammar allows no token: %s", m.get_error() or "no value fits the schema")
            allowed[self._eos] = 1
        logits[allowed == 0] = -np.inf

    def accept(self, token: int) -> None:
        m = self.matcher
        if not m.is_stopped() and not m.consume_token(token):
            log.warning("the grammar refused a token it had allowed: %s", m.get_error())


class GrammarCompiler:
    """JSON schemas to constraints for one model's vocabulary. ``compile`` is thread-safe
    and meant for a worker thread (a schema compiles in about a millisecond; the
    tokenizer is built once, in about 0.3 s)."""

    def __init__(self, vocab: Any, n_vocab: int, eos: list[int]) -> None:
        self._vocab = vocab
        self.n_vocab = n_vocab
        self._eos = [t for t in eos if t >= 0]
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._grammars: OrderedDict[str, str] = OrderedDict()

    def warm(self) -> bool:
        """Build the tokenizer now (at load, off the event loop), so that the first
        structured request does not wait for it. False when llguidance is not installed."""
        try:
            self._tok()
        except MissingDependencyError:
            return False
        return True

    def _tok(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                _llguidance()
                from llguidance.llamacpp import lltokenizer_from_vocab

                with warnings.catch_warnings():  # it calls llama_token_get_attr, deprecated
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self._tokenizer = lltokenizer_from_vocab(self._vocab, eos_token=self._eos or None)
            return self._tokenizer

    @staticmethod
    def _limits() -> Any:
        llg = _llguidance()
        # smaller than llguidance's defaults: a request's grammar, not a program's
        return llg.LLParserLimits(
            max_grammar_size=100_000, max_lexer_states=50_000, step_max_items=20_000, verbose_errors=False
        )

    def _problem(self, schema: dict[str, Any]) -> str:
        """Why ``schema`` does not compile ('' when it does)."""
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
        except (ValueError, TypeError, RecursionError) as exc:
            return str(exc) or exc.__class__.__name__
        return str(llg.LLMatcher.validate_grammar(grammar, None, limits=self._limits()))

    def _grammar(self, schema: dict[str, Any], field: str, param: str) -> str:
        key = json.dumps(schema, sort_keys=True)
        with self._lock:
            found = self._grammars.get(key)
            if found is not None:
                self._grammars.move_to_end(key)
                return found
        problem = self._problem(schema)
        if problem:
            where = _culprit(schema, self._problem)
            raise RequestError(
                f"'{field}' cannot be compiled: at '{where or '/'}': {problem.splitlines()[-1][:300]}",
                param,
            )
        llg = _llguidance()
        grammar = str(llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS))
        with self._lock:
            self._grammars[key] = grammar
            while len(self._grammars) > _CACHED_GRAMMARS:
                self._grammars.popitem(last=False)
        return grammar

    def compile(
        self, schema: dict[str, Any], field: str = SCHEMA_FIELD, param: str = "response_format"
    ) -> JsonConstraint:
        """A fresh constraint for one request (RequestError naming the request's ``field``
        and the failing part)."""
        llg = _llguidance()
        grammar = self._grammar(schema, field, param)
        matcher = llg.LLMatcher(self._tok(), grammar, log_level=0, limits=self._limits())
        c = JsonConstraint(matcher, self.n_vocab, self._eos)
        probe = np.zeros(self.n_vocab, np.float32)
        c.mask(probe)
        if matcher.is_error() or not np.isfinite(probe).any():
            raise RequestError(
                f"'{field}' admits no JSON value (contradictory bounds?)"
                + (f": {matcher.get_error()[:200]}" if matcher.is_error() else ""),
                param,
            )
        return c


def logits_view(ptr: Any, n_vocab: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A numpy view of llama.cpp's logits row at ``ptr`` (a ``float*`` or its address)."""
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))


def _children(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(node, dict):
        return
    for key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
        sub = node.get(key)
        if isinstance(sub, dict):
            for name, child in sub.items():
                yield f"{path}/{key}/{name}", child
    for key in ("items", "additionalProperties", "not", "contains", "propertyNames"):
        if isinstance(node.get(key), dict):
            yield f"{path}/{key}", node[key]
    for key in ("prefixItems", "anyOf", "oneOf", "allOf", "items"):
        sub = node.get(key)
        if isinstance(sub, list):
            for i, child in enumerate(sub):
                yield f"{path}/{key}/{i}", child


def _culprit(schema: dict[str, Any], problem: Any) -> str:
    """The JSON pointer of the deepest subschema that fails alone (with the root's
    definitions beside it, so that references still resolve); '' for the root."""
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    tried = 0
    node, where = schema, ""
    while True:
        for path, child in _children(node, where):
            if not isinstance(child, dict) or (path.split("/")[-2] in ("$defs", "definitions") and not where):
                continue
            tried += 1
            if tried > _MOST_PARTS:
                return where
            if problem({**defs, **child}):
                node, where = child, path
                break
        else:
            return where
