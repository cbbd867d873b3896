"""The request and answer shapes of generation, transport-free: OpenAI's chat and text
completions, and Triton's generate extension. Parsing checks every field a client may
get wrong and raises ``RequestError`` naming it; the front ends turn that into a 400 in
their format (OpenAI's ``{"error": {...}}`` for ``/v1``).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from milliserve.errors import RequestError
from milliserve.llm.fields import check_generate_fields, check_openai_fields, priority_of, schema_of
from milliserve.llm.tools import ToolCall, ToolPlan, parse_message_calls, parse_tools

__all__ = [
    "ChatMessage",
    "GenerationParams",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "openai_error",
    "parse_generate",
    "parse_openai",
    "server_timing",
]

MAX_STOP = 4
MAX_STOP_CHARS = 256
_ROLES = ("system", "developer", "user", "assistant", "tool")


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
    # the requested priority level (1 first; None: the model's default; fields.LOWEST_PRIORITY)
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


def _sampling(doc: dict[str, Any], p: GenerationParams) -> None:
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


def _content(v: Any, where: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list):  # [{"type": "text", "text": "..."}]
        parts = []
        for part in v:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise RequestError(f"{where}: only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    if v is None:
        return ""
    raise RequestError(f"{where}: 'content' must be a string or a list of text parts", "messages")


def parse_openai(doc: Any, chat: bool) -> GenerationParams:
    """A ``/v1/chat/completions`` (chat) or ``/v1/completions`` body."""
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object")
    check_openai_fields(doc, chat)
    p = GenerationParams()
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must name a model (GET /v1/models lists them)", "model")
    p.model = model
    if chat:
        msgs = doc.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in _ROLES:
                raise RequestError(f"messages[{i}]: 'role' must be one of {list(_ROLES)}", "messages")
            role, content = m["role"], _content(m.get("content"), f"messages[{i}]")
            if role == "assistant" and m.get("tool_calls"):
                calls = parse_message_calls(i, m["tool_calls"])
                out.append(ChatMessage(role, content, tool_calls=calls))
                p.tool_history = True
            elif role == "tool":
                call_id = m.get("tool_call_id")
                if not isinstance(call_id, str):
                    raise RequestError(f"messages[{i}]: a tool message needs its 'tool_call_id'", "messages")
                out.append(ChatMessage(role, content, tool_call_id=call_id))
                p.tool_history = True
            else:
                out.append(ChatMessage(role, content))
        p.messages = out
        p.tools = parse_tools(doc)
    else:
        prompt = doc.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("'prompt' must be a non-empty string", "prompt")
        p.prompt = prompt
    _sampling(doc, p)
    stream = doc.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", "stream")
    p.stream = stream
    opts = doc.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise RequestError("'stream_options' must be an object", "stream_options")
        p.include_usage = bool(opts.get("include_usage", False))
    p.priority = priority_of(doc)
    p.schema = schema_of(doc.get("response_format"))
    if p.schema is not None and p.tools is not None:
        raise RequestError(
            "'response_format' with a JSON schema and 'tools' cannot be combined (the answer is held "
            "to the tools' calls); send tool_choice 'none' to use response_format",
            "response_format",
        )
    return p


def parse_generate(doc: Any) -> GenerationParams:
    """A Triton generate-extension body: ``text_input`` and sampling fields, at the top
    level or in ``parameters`` (and vLLM's ``sampling_parameters`` JSON string)."""
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object")
    text = doc.get("text_input")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str) or not text:
        raise RequestError("'text_input' must be a non-empty string", "text_input")
    merged: dict[str, Any] = {k: v for k, v in doc.items() if k not in ("text_input", "parameters", "id")}
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError("'parameters' must be an object", "parameters")
    merged.update(params)
    sp = merged.pop("sampling_parameters", None)
    if isinstance(sp, str):
        try:
            sp = json.loads(sp)
        except ValueError:
            raise RequestError("'sampling_parameters' must be a JSON object", "sampling_parameters") from None
    if sp is not None:
        if not isinstance(sp, dict):
            raise RequestError("'sampling_parameters' must be a JSON object", "sampling_parameters")
        merged.update(sp)
    if "stop_words" in merged and "stop" not in merged:
        merged["stop"] = merged.pop("stop_words") or None
    check_generate_fields(merged)
    p = GenerationParams(prompt=text)
    _sampling(merged, p)
    stream = merged.get("stream", False)
    p.stream = bool(stream) if isinstance(stream, bool | int) else False
    p.priority = priority_of(merged)
    p.schema = schema_of(merged.get("response_format"))
    return p


# ---- answers ----
def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def new_id(chat: bool) -> str:
    return _id("chatcmpl" if chat else "cmpl")


def server_timing(timing: dict[str, float] | None) -> str:
    """The request's timing as a Server-Timing value (``queue;dur=1.2, ttft;dur=30.5, ...``)."""
    if not timing:
        return ""
    return ", ".join(f"{k.removesuffix('_ms')};dur={v:.3f}" for k, v in timing.items() if v >= 0)


def _usage(usage: dict[str, int] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]},
        "completion_tokens_details": {
            "accepted_prediction_tokens": usage["accepted_draft_tokens"],
            "rejected_prediction_tokens": usage["draft_tokens"] - usage["accepted_draft_tokens"],
        },
    }


def _answer(
    rid: str,
    kind: str,
    created: int,
    model: str,
    choice: dict[str, Any] | None,
    usage: dict[str, int] | None,
    timing: dict[str, float] | None = None,
    always_usage: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [] if choice is None else [{"index": 0, **choice}],
    }
    if usage is not None or always_usage:
        out["usage"] = _usage(usage)
    if timing is not None:
        out["server_timing"] = server_timing(timing)
    return out


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    timing: dict[str, float] | None = None,
) -> dict[str, Any]:
    choice = None if delta is None else {"delta": delta, "finish_reason": finish}
    return _answer(rid, "chat.completion.chunk", created, model, choice, usage, timing)


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str | None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    timing: dict[str, float] | None = None,
) -> dict[str, Any]:
    choice = None if text is None else {"text": text, "logprobs": None, "finish_reason": finish}
    return _answer(rid, "text_completion", created, model, choice, usage, timing)


def chat_response(
    model: str, text: str, finish: str, usage: dict[str, int] | None, message: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A chat answer: ``text`` as its content, or ``message`` as it is (tool calls)."""
    if message is None:
        message = {"role": "assistant", "content": text}
    choice = {"message": message, "logprobs": None, "finish_reason": finish}
    return _answer(new_id(True), "chat.completion", int(time.time()), model, choice, usage, always_usage=True)


def completion_response(model: str, text: str, finish: str, usage: dict[str, int] | None) -> dict[str, Any]:
    choice = {"text": text, "logprobs": None, "finish_reason": finish}
    return _answer(
        new_id(False), "text_completion", int(time.time()), model, choice, usage, always_usage=True
    )


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body for an HTTP ``status``."""
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        503: "service_unavailable",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = {404: "model_not_found", 429: "rate_limit_exceeded"}.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
