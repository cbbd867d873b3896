"""The ``parameters`` of a llama_cpp model (``milliserve.backends.llama_cpp``), read and
checked without llama.cpp: the table of what each means, and ``parse_llm_options``.

Config ``parameters`` understood here (string values):

=======================  ==================================================================
``n_threads``            threads of a step that decodes one token (default: the cores, at
                         most 4; one thread instead where that measures faster, as on a
                         machine busy with other work)
``n_threads_batch``      threads of a step with several tokens: prefill chunks and batched
                         decoding (default: the cores, at most 4; the same measured choice)
``n_ctx``                context length of each sequence (default 2048)
``max_sequences``        sequences decoded together (default 8); more wait in the queue
``step_tokens``          tokens one step may decode, prompt chunks included (default 256):
                         a long prompt is prefilled in chunks so it does not stall the others
``prefix_cache_slots``   shared prompt prefixes kept in the KV cache (default 2; 0: off)
``min_prefix_tokens``    shortest prefix worth reusing (default 16)
``prompt_cache_mib``     host memory for the KV of ended sequences, saved when their slot is
                         taken by another prompt and restored for a prompt that begins the
                         same way (default 256; 0: off)
``reuse_slots``          ``true`` (default): a free slot keeps the KV of the sequence that
                         ended in it, and a prompt that begins the same way (a chat's next
                         turn) takes that slot and starts from there; ``false``: freed at once
``speculative``          ``ngram`` (prompt lookup, default) or ``off``. Drafting with a
                         second, smaller GGUF is not offered: no smaller model of SmolLM2's
                         vocabulary ships here to build and test it with
``draft_tokens``         most tokens drafted per step (default 10; fewer while fewer are accepted)
``draft_min``            fewest of a lookup's tokens drafted where it found any, within the ITL
                         room (default 0: as many as the measured step costs say pay, none
                         where none do; at most ``draft_tokens``)
``speculate_below``      speculate only while fewer sequences than this decode, and no
                         prompt is prefilled beside them (default 3)
``draft_memory_tokens``  tokens of earlier answers kept to draft from, where a sequence's
                         last tokens match them (default 16384; 0: drafts come from the
                         sequence's own tokens only; ``llm.memory``)
``kv_unified``           ``true``: one KV buffer shared by all sequences (llama.cpp's
                         unified cache; default ``false``: one buffer per sequence)
``max_queue``            requests waiting for a free sequence before 503 (default 64); one
                         client may hold a share of it (``llm.admission``), then 429
``preemption``           ``fair`` (default: a client over its share of the slots has a
                         sequence suspended, its KV kept in host memory, while another
                         client waits), ``priority`` (also for a waiting request of a
                         higher priority level) or ``off``
``priority_levels``      priority levels of requests (default 2: ``priority: 1`` first)
``default_priority_level`` the level of a request that names none (default: the last)
``flash_attn``           ``auto`` (llama.cpp decides: on for the CPU; default), ``on`` or
                         ``off``. Off decoded faster here once sequences held a few hundred
                         tokens, but a token's logits then depend on how many tokens share
                         its step: greedy answers change with speculation and batching
``cache_type_k``,        the KV cache's element type, keys and values: ``f16`` (default),
``cache_type_v``         ``bf16``, ``f32``, ``q8_0``, ``q5_1``, ``q5_0``, ``q4_1``, ``q4_0`` or
                         ``iq4_nl`` (llama.cpp's ``-ctk``/``-ctv``). A quantized value cache
                         needs flash attention. ``q8_0`` halves the cache and, with flash
                         attention, made decoding faster here (docs/design.md)
``extra_buffers``        llama.cpp's extra weight buffers (repacked and AMX kernels): ``on``,
                         ``off``, or ``auto`` (default): off where the CPU advertises AMX,
                         whose kernels fault in VMs that do not hand AMX state to the guest
=======================  ==================================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from milliserve.config.model_config import ModelConfig
from milliserve.errors import ConfigError

__all__ = ["KNOWN_PARAMETERS", "LlmOptions", "parse_llm_options"]

KNOWN_PARAMETERS = frozenset(
    {
        "n_threads",
        "n_threads_batch",
        "n_ctx",
        "max_sequences",
        "step_tokens",
        "prefix_cache_slots",
        "min_prefix_tokens",
        "prompt_cache_mib",
        "reuse_slots",
        "speculative",
        "draft_tokens",
        "draft_min",
        "speculate_below",
        "draft_memory_tokens",
        "kv_unified",
        "max_queue",
        "preemption",
        "priority_levels",
        "default_priority_level",
        "flash_attn",
        "cache_type_k",
        "cache_type_v",
        "extra_buffers",
    }
)
# ggml's type ids of the KV cache types llama.cpp accepts (llama-server's -ctk/-ctv)
_GGML_TYPES = {
    "f16": 1,
    "bf16": 30,
    "f32": 0,
    "q8_0": 8,
    "q5_1": 7,
    "q5_0": 6,
    "q4_1": 3,
    "q4_0": 2,
    "iq4_nl": 20,
}


@dataclass(frozen=True, slots=True)
class LlmOptions:
    """The parsed ``parameters`` of a generative model."""

    n_threads: int = 2
    n_threads_batch: int = 2
    n_ctx: int = 2048
    max_sequences: int = 8
    step_tokens: int = 256
    prefix_cache_slots: int = 2
    min_prefix_tokens: int = 16
    prompt_cache_mib: int = 256
    reuse_slots: bool = True
    speculative: str = "ngram"
    draft_tokens: int = 10
    draft_min: int = 0
    speculate_below: int = 3
    draft_memory_tokens: int = 16384
    kv_unified: bool = False
    max_queue: int = 64
    preemption: str = "fair"
    priority_levels: int = 2
    default_priority_level: int = 2
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    extra_buffers: bool = True


def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return " amx_tile" in line
    except OSError:
        pass
    return False


def parse_llm_options(config: ModelConfig) -> LlmOptions:
    """``parameters`` -> LlmOptions; ConfigError naming the parameter for a bad value."""
    params = config.parameters
    unknown = sorted(set(params) - KNOWN_PARAMETERS)
    if unknown:
        raise ConfigError(
            f"field 'parameters': {unknown} are not llama_cpp parameters; use {sorted(KNOWN_PARAMETERS)}"
        )

    def whole(key: str, default: int, low: int, high: int = 1 << 30) -> int:
        raw = params.get(key)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ConfigError(f"field 'parameters.{key}': {raw!r} is not a whole number in [{low}, {high}]")
        return value

    cores = os.cpu_count() or 1
    spec = params.get("speculative", "ngram").strip()
    levels = whole("priority_levels", 2, 1, 64)
    draft_tokens = whole("draft_tokens", 10, 1, 64)
    flash_attn = _choice(params, "flash_attn", ("auto", "on", "off"), "auto")
    kv_types = tuple(_GGML_TYPES)
    cache_type_v = _choice(params, "cache_type_v", kv_types, "f16")
    if flash_attn == "off" and cache_type_v not in ("f16", "bf16", "f32"):
        raise ConfigError(
            f"field 'parameters.cache_type_v': {cache_type_v!r} needs flash attention "
            "(flash_attn 'on' or 'auto')"
        )
    return LlmOptions(
        n_threads=whole("n_threads", min(cores, 4), 1, 256),
        n_threads_batch=whole("n_threads_batch", min(cores, 4), 1, 256),
        n_ctx=whole("n_ctx", 2048, 64, 1 << 20),
        max_sequences=whole("max_sequences", 8, 1, 256),
        step_tokens=whole("step_tokens", 256, 16, 1 << 16),
        prefix_cache_slots=whole("prefix_cache_slots", 2, 0, 64),
        min_prefix_tokens=whole("min_prefix_tokens", 16, 1),
        prompt_cache_mib=whole("prompt_cache_mib", 256, 0, 1 << 20),
        reuse_slots=_flag(params, "reuse_slots", True),
        speculative=spec,
        draft_tokens=draft_tokens,
        draft_min=whole("draft_min", 0, 0, draft_tokens),
        speculate_below=whole("speculate_below", 3, 0, 256),
        draft_memory_tokens=whole("draft_memory_tokens", 16384, 0, 1 << 22),
        kv_unified=_flag(params, "kv_unified", False),
        max_queue=whole("max_queue", 64, 0),
        preemption=_choice(params, "preemption", ("fair", "priority", "off"), "fair"),
        priority_levels=levels,
        default_priority_level=whole("default_priority_level", levels, 1, levels),
        flash_attn=flash_attn,
        cache_type_k=_choice(params, "cache_type_k", kv_types, "f16"),
        cache_type_v=cache_type_v,
        extra_buffers={"on": True, "off": False, "auto": not _cpu_has_amx()}[
            _choice(params, "extra_buffers", ("auto", "on", "off"), "auto")
        ],
    )


def _flag(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key, str(default)).strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise ConfigError(f"field 'parameters.{key}': {value!r} is not true or false")
    return value in ("true", "1")


def _choice(params: dict[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = params.get(key, default).strip().lower()
    if value not in allowed:
        raise ConfigError(f"field 'parameters.{key}': {value!r} is not one of {list(allowed)}")
    return value
