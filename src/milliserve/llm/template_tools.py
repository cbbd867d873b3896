"""Tools in a chat template: whether a model's template has a call format of its own, and
the messages it is given either way.

A template with one (Hermes-style ``<tool_call>{"name": ...}`` blocks: Qwen 2.5 and 3,
QwQ, Hermes 2 Pro and 3, Granite 4) gets the tools as its ``tools`` variable and the
calls and results as OpenAI's messages carry them; its answers are parsed
(``llm.tool_calls.TaggedCalls``). A template without one (SmolLM2's, ChatML, or calls in
another format: Qwen3-Coder's XML, GLM's) gets what llama.cpp's template polyfills give
such a model: the tools described in the system message, an assistant's calls as the
JSON its constrained answers are (``llm.tools.call_schema``), and each result as a user
message ``{"tool_response": {"name": ..., "content": ...}}``, which keeps the turns
alternating for templates that insist on it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from milliserve.llm.generation_params import ChatMessage
from milliserve.llm.tools import Tool, ToolCall, ToolPlan, tools_prompt

__all__ = ["native_calls", "template_message", "template_tools", "tool_messages"]

log = logging.getLogger(__name__)

_PROBE = "milliserve_probe_function"


def native_calls(source: str | None, render: Callable[..., str]) -> bool:
    """The template (``source``, rendered by ``render(**context)``) shows tools and calls
    in the ``<tool_call>`` format: its tools appear when given, and an assistant's call as
    ``<tool_call>{"name": ...``."""
    if not source or "<tool_call>" not in source:
        return False
    call = ToolCall("call_probe", _PROBE + "_call", "{}")
    try:
        with_tools = render(
            messages=[{"role": "user", "content": "hi"}],
            tools=template_tools((Tool(_PROBE, "", {"type": "object"}),)),
        )
        with_call = render(
            messages=[
                {"role": "user", "content": "hi"},
                template_message(ChatMessage("assistant", "", tool_calls=(call,)), ""),
            ]
        )
    except Exception as exc:  # a template that fails on tools has no usable format
        log.info("the chat template has <tool_call> but cannot render tools (%s)", exc)
        return False
    # the call as JSON inside the tags (Qwen3-Coder's, Nemotron's and GLM's tags hold XML)
    as_json = re.search(r'<tool_call>\s*\{\s*"name":\s*"' + call.name + '"', with_call)
    return _PROBE in with_tools and as_json is not None


def template_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    """The ``tools`` variable of a template: OpenAI's request shape."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _arguments(text: str) -> Any:
    """A call's arguments as templates expect them: an object (``| tojson`` in Qwen's)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def template_message(m: ChatMessage, content: str) -> dict[str, Any]:
    """A message as a template with tools reads it (``content`` in place of its own)."""
    doc: dict[str, Any] = {"role": m.role, "content": content}
    if m.tool_calls:
        doc["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        doc["tool_call_id"] = m.tool_call_id
    return doc


def tool_messages(given: list[ChatMessage], plan: ToolPlan | None) -> list[ChatMessage]:
    """The messages for a template without tools: calls and results as text, and the
    tools (if the answer may call some) described in the first system message."""
    names: dict[str, str] = {}
    out: list[ChatMessage] = []
    for m in given:
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                names[c.id] = c.name
                calls.append({"name": c.name, "arguments": _arguments(c.arguments)})
            text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            out.append(ChatMessage("assistant", f"{m.content}\n{text}" if m.content else text))
        elif m.role == "tool":
            name = names.get(m.tool_call_id or "", m.tool_call_id or "")
            doc = {"tool_response": {"name": name, "content": m.content}}
            out.append(ChatMessage("user", json.dumps(doc, ensure_ascii=False)))
        else:
            out.append(m)
    if plan is not None:
        described = tools_prompt(plan)
        if out and out[0].role in ("system", "developer"):
            out[0] = ChatMessage(out[0].role, f"{out[0].content}\n\n{described}")
        else:
            out.insert(0, ChatMessage("system", described))
    return out
