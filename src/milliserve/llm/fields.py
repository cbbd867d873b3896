"""Which request fields generation honours, and the refusal of every other one.

A field the server would accept and then ignore is a silent lie: a client asking for
JSON got prose, a client asking for log-probabilities got none. So each field of
OpenAI's chat and text completion requests is here in one of three groups:

- honoured (parsed in ``llm.protocol``; a chat's tools in ``llm.tools``);
- describing the caller, not the answer (``user``, ``metadata``...): accepted, they
  change nothing OpenAI's own server would return either;
- not supported: accepted only with the value that means "off" (``logprobs: false``,
  ``tools: []``), otherwise a 400 that names the field.

Anything else on an OpenAI route is refused by name too. Triton's generate extension
is looser by convention (clients put transport parameters beside the sampling ones),
so there only the fields that would change the answer and are not honoured are refused.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from milliserve.errors import RequestError

__all__ = [
    "LOWEST_PRIORITY",
    "MAX_SCHEMA_BYTES",
    "check_generate_fields",
    "check_openai_fields",
    "priority_of",
    "schema_of",
]

# a JSON schema's text beyond this is refused before it is compiled
MAX_SCHEMA_BYTES = 64 << 10

_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "response_format",
        "service_tier",
        # milliserve's (and vLLM's) extra fields
        "top_k",
        "repetition_penalty",
        "ignore_eos",
        "speculative",
        "priority",
    }
)
# tool calling (llm.tools), chat only
_TOOLS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
_CHAT = _COMMON | _TOOLS | {"messages", "max_completion_tokens"}
_COMPLETION = _COMMON | {"prompt"}
# the caller's bookkeeping: no effect on any answer (OpenAI's server uses them for abuse
# monitoring, dashboards and cache routing; the prefix cache here needs no hint)
_BOOKKEEPING = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key"})
# not supported: the values that mean "off", which are accepted
_OFF: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "store": (None, False),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
}
_OFF_CHAT = {k: v for k, v in _OFF.items() if k not in _TOOLS}
# Triton generate: fields that change the answer and are not honoured
_GENERATE_REFUSED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "return_log_probs": (None, False),
    "logit_bias": (None, {}),
    "bad_words": (None, [], ""),
    "beam_width": (None, 1),
    "use_beam_search": (None, False),
    "best_of": (None, 1),
    "min_tokens": (None, 0),
    "min_p": (None, 0, 0.0),
    "length_penalty": (None, 1, 1.0),
    "exclude_input_in_output": (None, True),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_grammar": (None,),
    "guided_choice": (None,),
    "lora_name": (None, ""),
}
# service_tier "flex" (slower, cheaper) asks for the lowest priority level
LOWEST_PRIORITY = -1


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _refuse_unless_off(doc: dict[str, Any], table: dict[str, tuple[Any, ...]]) -> None:
    for key, off in table.items():
        if key in doc and not any(_same(doc[key], v) for v in off):
            shown = ", ".join("null" if v is None else json.dumps(v) for v in off)
            raise RequestError(
                f"'{key}' is not supported by this server (accepted only as {shown}); "
                f"got {json.dumps(doc[key])[:80]}",
                key,
            )


def check_openai_fields(doc: dict[str, Any], chat: bool) -> None:
    """Refuse, by name, any field of a chat or text completion that would not be honoured."""
    known = _CHAT if chat else _COMPLETION
    _refuse_unless_off(doc, _OFF_CHAT if chat else _OFF)
    for key in doc:
        if key not in known and key not in _BOOKKEEPING and key not in _OFF:
            what = "chat completion" if chat else "completion"
            raise RequestError(f"unknown field '{key[:64]}' for a {what} request", key[:64])
    opts = doc.get("stream_options")
    if isinstance(opts, dict):
        for key, value in opts.items():
            if key != "include_usage" and value not in (None, False):
                raise RequestError(
                    f"'stream_options.{key[:64]}' is not supported by this server", "stream_options"
                )
        if not isinstance(opts.get("include_usage", False), bool):
            raise RequestError("'stream_options.include_usage' must be true or false", "stream_options")


def check_generate_fields(doc: dict[str, Any]) -> None:
    """Refuse the generate-extension fields that would change the answer if honoured."""
    _refuse_unless_off(doc, _GENERATE_REFUSED)


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
