"""One generation request, whatever the API it came through (OpenAI's chat, text
completions and Responses; Triton's generate extension), and the parsing of the fields
those APIs share: sampling, ``priority`` and ``service_tier``, ``response_format``. Each
check raises ``RequestError`` naming the field; the front ends turn it into a 400 in
their format. The APIs' own shapes are in ``milliserve.openai`` and
``llm.generate_extension``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from milliserve.errors import RequestError
from milliserve.llm.tools import ToolCall, ToolPlan

__all__ = [
    "LOWEST_PRIORITY",
    "MAX_SCHEMA_BYTES",
    "ChatMessage",
    "GenerationParams",
    "parse_sampling",
    "priority_of",
    "refuse_unless_off",
    "schema_of",
]

MAX_STOP = 4
MAX_STOP_CHARS = 256
# a JSON schema's text beyond this is refused before it is compiled
MAX_SCHEMA_BYTES = 64 << 10
# service_tier "flex" (slower, cheaper) asks for the lowest priority level
LOWEST_PRIORITY = -1


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    # an assistant's calls; a tool message's answer to one of them
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(slots=True)
class GenerationParams:
    """One generation request, whatever the API it came through. ``prompt`` is text for
    completions and generate; ``messages`` for chat (rendered by the model's template)."""

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False
    speculate: bool = True
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    # the JSON schema the answer must follow (``response_format``), None for free text
    schema: dict[str, Any] | None = None
    # the tools the answer may call (None: it calls none)
    tools: ToolPlan | None = None
    # a message calls a tool or answers one (rendered as the model's template shows calls)
    tool_history: bool = False
    # the requested priority level (1 first; None: the model's default; LOWEST_PRIORITY)
    priority: int | None = None
    # who sent it, for fair admission (set by the front end: the peer's address)
    client: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _number(doc: dict[str, Any], key: str, low: float, high: float, default: float) -> float:
    v = doc.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not low <= v <= high:
        raise RequestError(f"'{key}' must be a number in [{low:g}, {high:g}], got {v!r}", key)
    return float(v)


def _whole(doc: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        bound = f" and at most {high}" if high is not None else ""
        raise RequestError(f"'{key}' must be a whole number of at least {low}{bound}, got {v!r}", key)
    return int(v)


def _stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in items)
    ):
        raise RequestError(
            f"'stop' must be a string or a list of at most {MAX_STOP} non-empty strings of at most "
            f"{MAX_STOP_CHARS} characters",
            "stop",
        )
    return tuple(items)


def parse_sampling(doc: dict[str, Any], p: GenerationParams) -> None:
    """The sampling fields every API shares, checked, into ``p``."""
    max_tokens = _whole(doc, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _whole(doc, "max_tokens", 1)
    p.max_tokens = max_tokens
    p.temperature = _number(doc, "temperature", 0.0, 2.0, 1.0)
    p.top_p = _number(doc, "top_p", 0.0, 1.0, 1.0)
    if p.top_p == 0.0:
        raise RequestError("'top_p' must be above 0", "top_p")
    p.top_k = _whole(doc, "top_k", 0) or 0
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be a whole number, got {seed!r}", "seed")
    p.seed = seed
    p.stop = _stop(doc.get("stop"))
    p.repetition_penalty = _number(doc, "repetition_penalty", 0.01, 10.0, 1.0)
    p.frequency_penalty = _number(doc, "frequency_penalty", -2.0, 2.0, 0.0)
    p.presence_penalty = _number(doc, "presence_penalty", -2.0, 2.0, 0.0)
    ignore = doc.get("ignore_eos", False)
    spec = doc.get("speculative", True)
    if not isinstance(ignore, bool) or not isinstance(spec, bool):
        raise RequestError("'ignore_eos' and 'speculative' must be true or false")
    p.ignore_eos, p.speculate = ignore, spec
    n = doc.get("n", 1)
    if n != 1:
        raise RequestError(f"'n' must be 1 (one choice per request), got {n!r}", "n")


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def refuse_unless_off(doc: dict[str, Any], table: dict[str, tuple[Any, ...]]) -> None:
    """Refuse, by name, a field of ``table`` sent with a value other than one meaning "off"."""
    for key, off in table.items():
        if key in doc and not any(_same(doc[key], v) for v in off):
            shown = ", ".join("null" if v is None else json.dumps(v) for v in off)
            raise RequestError(
                f"'{key}' is not supported by this server (accepted only as {shown}); "
                f"got {json.dumps(doc[key])[:80]}",
                key,
            )


def priority_of(doc: dict[str, Any]) -> int | None:
    """The request's priority: ``priority`` (1 is served first; 0 or absent, the model's
    default level), or OpenAI's ``service_tier`` (``priority``: level 1; ``flex``: the
    lowest level). None for the default; LOWEST_PRIORITY for the lowest level."""
    tier = doc.get("service_tier")
    if tier not in (None, "auto", "default", "priority", "flex"):
        raise RequestError(
            f"'service_tier' must be one of auto, default, priority, flex; got {json.dumps(tier)[:40]}",
            "service_tier",
        )
    value = doc.get("priority")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RequestError(
                f"'priority' must be a whole number of at least 0 (1 is served first; 0 means the "
                f"model's default level), got {json.dumps(value)[:40]}",
                "priority",
            )
        return value or None
    return {"priority": 1, "flex": LOWEST_PRIORITY}.get(tier or "")


def schema_of(value: Any) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks the answer to follow (``json_object``: any
    object), or None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise RequestError(
            "'response_format' must be an object with a 'type': text, json_object or json_schema",
            "response_format",
        )
    kind = value["type"]
    extra = sorted(set(value) - {"type", "json_schema"})
    if extra:
        raise RequestError(f"unknown field 'response_format.{extra[0][:64]}'", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise RequestError(
            f"'response_format.type' must be text, json_object or json_schema, got {json.dumps(kind)[:40]}",
            "response_format",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError(
            "'response_format.json_schema' must be an object with a 'schema'", "response_format"
        )
    unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if unknown:
        raise RequestError(
            f"unknown field 'response_format.json_schema.{unknown[0][:64]}'", "response_format"
        )
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise RequestError(
            "'response_format.json_schema.schema' must be a JSON schema (an object)", "response_format"
        )
    if "strict" in spec and not isinstance(spec["strict"], bool | None):
        raise RequestError("'response_format.json_schema.strict' must be true or false", "response_format")
    if len(orjson.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise RequestError(
            f"'response_format.json_schema.schema' is over {MAX_SCHEMA_BYTES} bytes", "response_format"
        )
    return schema
