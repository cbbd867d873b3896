"""Tool calling, the request side: OpenAI's ``tools``, ``tool_choice`` and
``parallel_tool_calls`` parsed into a ``ToolPlan``, and the JSON schema that constrains
an answer to calls of those tools.

A constrained answer is one JSON document, whatever the model's template:
``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``; with ``auto`` on a model
whose template has no call format of its own it may instead be ``{"response": "..."}``.
Each call's ``arguments`` follows its function's ``parameters`` schema, so every call
parses and validates, even from a 135M model. ``llm.tool_calls`` turns that text (or a
template's own ``<tool_call>`` blocks) into OpenAI's ``tool_calls`` as it is generated.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from milliserve.errors import RequestError

__all__ = [
    "Tool",
    "ToolCall",
    "ToolPlan",
    "call_schema",
    "parse_message_calls",
    "parse_tools",
    "tools_prompt",
]

# OpenAI's rule for a function's name
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
# all tools' schemas together; the grammar compiler has its own limits besides
MAX_TOOLS_BYTES = 256 << 10
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class Tool:
    """One function a model may call; ``parameters`` is the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call an assistant message made (``arguments``: JSON text, as OpenAI sends it)."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ToolPlan:
    """What a request allows: ``choice`` is ``auto`` or ``required`` (``none`` never makes
    a plan); ``function`` names the one function a named ``tool_choice`` asks for."""

    tools: tuple[Tool, ...]
    choice: str
    function: str | None
    parallel: bool
    # set by the model's prompt (ChatPrompt.plan_tools): the answer is the template's own
    # call format (parsed), not the constrained JSON document
    native: bool = False

    def offered(self) -> tuple[Tool, ...]:
        """The tools the answer may call (the named one alone, when one is named)."""
        if self.function is None:
            return self.tools
        return tuple(t for t in self.tools if t.name == self.function)


def _tool(i: int, item: Any) -> Tool:
    where = f"tools[{i}]"
    if (
        not isinstance(item, dict)
        or item.get("type") != "function"
        or not isinstance(item.get("function"), dict)
    ):
        raise RequestError(f"{where} must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools")
    extra = sorted(set(item) - {"type", "function"})
    if extra:
        raise RequestError(f"unknown field '{where}.{extra[0][:64]}'", "tools")
    fn = item["function"]
    unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise RequestError(f"unknown field '{where}.function.{unknown[0][:64]}'", "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RequestError(
            f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {json.dumps(name)[:80]}",
            "tools",
        )
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise RequestError(f"{where}.function.description must be a string", "tools")
    if not isinstance(fn.get("strict", False), bool | None):
        raise RequestError(f"{where}.function.strict must be true or false", "tools")
    params = fn.get("parameters")
    if params is None:
        params = _EMPTY_PARAMETERS
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise RequestError(
            f"{where}.function.parameters (function '{name}') must be a JSON schema of an object, "
            f"got {json.dumps(params)[:80]}",
            "tools",
        )
    return Tool(name, description, params)


def parse_tools(doc: dict[str, Any]) -> ToolPlan | None:
    """The plan of a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``;
    None when it calls no tool (no tools, or ``tool_choice: none``). A malformed tool or a
    choice naming no tool is a RequestError saying which."""
    if "tools" not in doc and "tool_choice" not in doc and "parallel_tool_calls" not in doc:
        return None  # the plain chat's road: nothing more to look at
    raw = doc.get("tools")
    choice = doc.get("tool_choice")
    parallel = doc.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    if raw is None:
        raw = []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise RequestError(f"'tools' must be a list of at most {MAX_TOOLS} functions", "tools")
    if len(orjson.dumps(raw)) > MAX_TOOLS_BYTES:
        raise RequestError(f"'tools' is over {MAX_TOOLS_BYTES} bytes", "tools")
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RequestError(f"'tools' names the function '{twice[0]}' more than once", "tools")
    function: str | None = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if (
            choice.get("type") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise RequestError(
                "'tool_choice' must be none, auto, required or {'type': 'function', 'function': "
                f"{{'name': ...}}}}, got {json.dumps(choice)[:80]}",
                "tool_choice",
            )
        function = fn["name"]
        if function not in names:
            raise RequestError(
                f"'tool_choice' names the function {json.dumps(function)[:80]}, which is not in 'tools' "
                f"({', '.join(names) or 'none given'})",
                "tool_choice",
            )
        choice = "required"
    elif choice not in ("none", "auto", "required"):
        raise RequestError(
            f"'tool_choice' must be none, auto, required or a named function, got {json.dumps(choice)[:80]}",
            "tool_choice",
        )
    if choice == "required" and not tools:
        raise RequestError("'tool_choice' is required but 'tools' is empty", "tool_choice")
    if choice == "none" or not tools:
        return None
    return ToolPlan(tools, choice, function, parallel is not False)


def parse_message_calls(i: int, value: Any) -> tuple[ToolCall, ...]:
    """The ``tool_calls`` of ``messages[i]``, an assistant message."""
    if value is None:
        return ()
    where = f"messages[{i}].tool_calls"
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a list", "messages")
    out = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(fn, dict)
            or call.get("type", "function") != "function"
            or not isinstance(call.get("id"), str)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments"), str)
        ):
            raise RequestError(
                f"{where}[{j}] must be {{'id': str, 'type': 'function', 'function': {{'name': str, "
                "'arguments': str}}}}",
                "messages",
            )
        out.append(ToolCall(call["id"], fn["name"], fn["arguments"]))
    return tuple(out)


# ---- the constraint ----
def _rewrite_refs(node: Any, prefix: str) -> Any:
    """``node`` with its local ``$ref``s pointing into the root's ``$defs`` under ``prefix``."""
    if isinstance(node, dict):
        out = {k: _rewrite_refs(v, prefix) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            rest = ref[1:]
            for defs in ("/$defs/", "/definitions/"):
                if rest.startswith(defs):
                    out["$ref"] = f"#/$defs/{prefix}_{rest[len(defs) :]}"
                    break
            else:
                out["$ref"] = f"#/$defs/{prefix}{rest}"  # '#', or a pointer into the schema
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, prefix) for v in node]
    return node


def _arguments(i: int, tool: Tool, defs: dict[str, Any]) -> dict[str, Any]:
    """The schema of a tool's arguments, inside the answer's schema. A schema with
    references (``#/$defs/x``, or ``#`` itself) has them resolved from the root, so it
    and its definitions move to the root's ``$defs`` (``t{i}``, ``t{i}_x``)."""
    params = tool.parameters
    if b'"$ref"' not in orjson.dumps(params):
        return params
    prefix = f"t{i}"
    moved = _rewrite_refs(copy.deepcopy(params), prefix)
    for key in ("$defs", "definitions"):
        for name, sub in (moved.pop(key, None) or {}).items():
            defs[f"{prefix}_{name}"] = sub
    defs[prefix] = moved
    return {"$ref": f"#/$defs/{prefix}"}


def call_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON schema an answer follows: one or more calls (one when ``parallel_tool_calls``
    is false or a function is named), or, with ``auto``, a ``response`` instead."""
    defs: dict[str, Any] = {}
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": _arguments(i, t, defs)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, t in enumerate(plan.offered())
    ]
    items = calls[0] if len(calls) == 1 else {"anyOf": calls}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not plan.parallel or plan.function is not None:
        array["maxItems"] = 1
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"tool_calls": array},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if plan.choice == "auto":
        answer = {
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": False,
        }
        schema = {"anyOf": [schema, answer]}
    if defs:
        schema["$defs"] = defs
    return schema


def tools_prompt(plan: ToolPlan) -> str:
    """What a model whose template knows no tools is told of them (in its system
    message): the functions, and the JSON its answer is held to."""
    lines = ["You can call these functions (each one's arguments follow its JSON schema):"]
    for t in plan.offered():
        doc = {"name": t.name, "description": t.description, "parameters": t.parameters}
        lines.append(json.dumps(doc, ensure_ascii=False))
    lines.append(
        'To call functions, answer with JSON only: {"tool_calls": [{"name": "<function name>", '
        '"arguments": {<its arguments>}}]}'
    )
    if plan.choice == "auto":
        lines.append('To answer without calling a function, answer with JSON: {"response": "<your answer>"}')
    return "\n".join(lines)
