"""OpenAI's chat and text completions (``/v1/chat/completions``, ``/v1/completions``),
transport-free: a body parsed into ``GenerationParams``, and the answers and stream chunks
written back. Parsing checks every field a client may get wrong and raises
``RequestError`` naming it; the front end turns that into OpenAI's ``{"error": {...}}``
(``openai.error_body``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from milliserve.errors import RequestError
from milliserve.llm.generation_params import (
    ChatMessage,
    GenerationParams,
    parse_sampling,
    priority_of,
    schema_of,
)
from milliserve.llm.tools import parse_message_calls, parse_tools
from milliserve.openai.fields import check_openai_fields

__all__ = [
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "new_id",
    "parse_openai",
    "server_timing",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")


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
    parse_sampling(doc, p)
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
