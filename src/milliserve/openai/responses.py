"""OpenAI's Responses API (``/v1/responses``), stateless: a request translated into the
chat completion it amounts to, and the answer made into a ``response`` object or its
stream of typed events.

Nothing is stored: ``previous_response_id``, ``conversation``, ``store: true`` and
``background`` are refused with a 400 saying so; a client sends the whole conversation
as ``input`` each time (messages, ``function_call`` and ``function_call_output`` items),
which the SDK's ``response.output`` makes easy to append. ``input`` as text or items,
``instructions`` (a system message), ``max_output_tokens``, ``temperature``, ``top_p``,
``text.format`` (``json_schema``, ``json_object``) and function ``tools`` with
``tool_choice`` and ``parallel_tool_calls`` are honoured; other fields are accepted only
with the value that means "off", as on the chat routes (``openai.fields``).
"""

from __future__ import annotations

import json
from typing import Any

from milliserve.errors import RequestError
from milliserve.llm.generation_params import GenerationParams
from milliserve.openai.completions import parse_openai

__all__ = ["parse_responses"]

_HONOURED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "text",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "service_tier",
        "priority",
        "top_k",
        "seed",
        "stop",
        "repetition_penalty",
    }
)
_BOOKKEEPING = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key"})
# fields accepted only with the values that mean "off" (nothing stored, nothing extra)
_OFF: dict[str, tuple[Any, ...]] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "store": (None, False),
    "background": (None, False),
    "include": (None, []),
    "reasoning": (None, {}),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
    "max_tool_calls": (None,),
    "prompt": (None,),
    "stream_options": (None, {}, {"include_obfuscation": False}, {"include_obfuscation": True}),
}
_STATELESS = {
    "previous_response_id": "this server stores no responses (it is stateless): send the whole "
    "conversation as 'input', the earlier response's output items included",
    "conversation": "this server stores no conversations (it is stateless): send the whole "
    "conversation as 'input'",
    "store": "this server stores no responses (it is stateless): send store false, or leave it out",
    "background": "this server runs no background responses (nothing is stored to fetch later)",
}
_ROLES = ("user", "system", "developer", "assistant")
# the chat's fields whose errors name this API's
_PARAMS = {"response_format": "text", "messages": "input"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def _refuse_unknown(doc: dict[str, Any]) -> None:
    for key in doc:
        if key not in _HONOURED and key not in _BOOKKEEPING and key not in _OFF:
            raise RequestError(f"unknown field '{key[:64]}' for a response request", key[:64])
    for key, off in _OFF.items():
        if key in doc and not any(type(doc[key]) is type(v) and doc[key] == v for v in off):
            why = _STATELESS.get(key, "it is not supported by this server")
            raise RequestError(f"'{key}' cannot be {json.dumps(doc[key])[:60]}: {why}", key)


def _text(value: Any, where: str) -> str:
    """A content given as text or as text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out = []
        for j, part in enumerate(value):
            if (
                not isinstance(part, dict)
                or part.get("type") not in _TEXT_PARTS
                or not isinstance(part.get("text"), str)
            ):
                raise RequestError(
                    f"{where}[{j}]: only text parts ({', '.join(_TEXT_PARTS)}) are supported", "input"
                )
            out.append(part["text"])
        return "".join(out)
    raise RequestError(f"{where} must be a string or a list of text parts", "input")


def _messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of ``instructions`` and ``input``: function calls become an
    assistant's ``tool_calls`` (consecutive ones, one message), their outputs ``tool``
    messages."""
    out: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("'instructions' must be a string", "instructions")
        out.append({"role": "system", "content": instructions})
    given = doc.get("input")
    if isinstance(given, str):
        if not given:
            raise RequestError("'input' must not be empty", "input")
        return [*out, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise RequestError("'input' must be a string or a non-empty list of items", "input")
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise RequestError(f"{where}: 'role' must be one of {list(_ROLES)}", "input")
            out.append({"role": item["role"], "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, arguments)):
                raise RequestError(
                    f"{where}: a function_call needs 'call_id', 'name' and 'arguments'", "input"
                )
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = out[-1] if out else None
            if (
                last is not None
                and last["role"] == "assistant"
                and last.get("tool_calls")
                and not last["content"]
            ):
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}: a function_call_output needs its 'call_id'", "input")
            output = _text(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "item_reference":
            raise RequestError(f"{where}: {_STATELESS['previous_response_id']}", "input")
        else:
            raise RequestError(
                f"{where}: items of type {json.dumps(kind)[:40]} are not supported (message, "
                "function_call and function_call_output are)",
                "input",
            )
    return out


def _format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as a chat's ``response_format``."""
    if text is None:
        return None
    if not isinstance(text, dict) or sorted(set(text) - {"format", "verbosity"}):
        raise RequestError("'text' must be an object with a 'format'", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise RequestError("'text.verbosity' is not supported by this server", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError("'text.format' must be an object with a 'type'", "text")
    if fmt.get("type") == "json_schema":
        spec = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": spec}
    return fmt


def _tools(value: Any) -> Any:
    """Function tools in the chat's shape (``{"type": "function", "function": {...}}``)."""
    if not isinstance(value, list):
        return value
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise RequestError(
                f"tools[{i}]: only function tools are supported, got type {json.dumps(kind)[:40]}", "tools"
            )
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function" and "name" in value:
        return {"type": "function", "function": {"name": value["name"]}}
    return value


def parse_responses(doc: Any) -> GenerationParams:
    """A ``/v1/responses`` body as the chat request it amounts to (RequestError naming
    the field a client got wrong, or one that would need stored state)."""
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_unknown(doc)
    max_tokens = doc.get("max_output_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise RequestError(
            f"'max_output_tokens' must be a whole number of at least 1, got {json.dumps(max_tokens)[:40]}",
            "max_output_tokens",
        )
    chat: dict[str, Any] = {"model": doc.get("model"), "messages": _messages(doc)}
    for key in (
        "temperature",
        "top_p",
        "stream",
        "parallel_tool_calls",
        "service_tier",
        "priority",
        "top_k",
        "seed",
    ):
        if key in doc:
            chat[key] = doc[key]
    for key in ("stop", "repetition_penalty"):
        if key in doc:
            chat[key] = doc[key]
    if max_tokens is not None:
        chat["max_completion_tokens"] = max_tokens
    fmt = _format(doc.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if doc.get("tools") is not None:
        chat["tools"] = _tools(doc["tools"])
    if doc.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(doc["tool_choice"])
    try:
        return parse_openai(chat, chat=True)
    except RequestError as exc:  # named as this API names the field
        param = exc.args[1] if len(exc.args) > 1 else None
        if param not in _PARAMS:
            raise
        message = exc.message.replace("'response_format", "'text.format").replace("'messages'", "'input'")
        raise RequestError(message, _PARAMS[param]) from None
