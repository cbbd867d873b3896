"""Tool calling's pure logic: the request's tools and choice parsed (a malformed tool or a
choice naming no tool is a RequestError saying which), and the schema calls are held to."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from milliserve.errors import RequestError
from milliserve.llm.tools import call_schema, parse_tools
from milliserve.openai.completions import parse_openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_tools_and_choice_are_parsed() -> None:
    plan = parse_tools({"tools": [WEATHER, ADD]})
    assert plan is not None and plan.choice == "auto" and plan.parallel and plan.function is None
    assert [t.name for t in plan.tools] == ["get_weather", "add"]
    named = parse_tools(
        {"tools": [WEATHER, ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}}
    )
    assert named is not None and named.choice == "required" and named.function == "add"
    assert [t.name for t in named.offered()] == ["add"]
    one = parse_tools({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    assert one is not None and not one.parallel


@pytest.mark.parametrize("doc", [{}, {"tools": []}, {"tools": [WEATHER], "tool_choice": "none"}])
def test_no_tools_or_choice_none_make_no_plan(doc: dict[str, Any]) -> None:
    assert parse_tools(doc) is None


@pytest.mark.parametrize(
    ("doc", "param", "says"),
    [
        ({"tools": [{"type": "function"}]}, "tools", "tools[0]"),
        ({"tools": [WEATHER, {"type": "retrieval", "function": {}}]}, "tools", "tools[1]"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools",
            "function 'f'",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools", "'f'"),
        ({"tools": [ADD, ADD]}, "tools", "'add' more than once"),
        ({"tools": [{"type": "function", "function": {"name": "f", "args": {}}}]}, "tools", "args"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "always"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            '"nope", which is not in',
        ),
        ({"tools": [], "tool_choice": "required"}, "tool_choice", "empty"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
        ({"tools": {"name": "f"}}, "tools", "list"),
    ],
)
def test_malformed_tools_are_refused_saying_which(doc: dict[str, Any], param: str, says: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_openai(_chat(**doc), chat=True)
    assert err.value.args[1] == param and says in err.value.message, err.value.message


def test_tool_messages_are_parsed() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    p = parse_openai(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "3"},
            ],
        },
        chat=True,
    )
    assert p.tool_history and p.tools is None and p.messages is not None
    assert p.messages[1].tool_calls[0].name == "add" and p.messages[2].tool_call_id == "c1"
    plain = parse_openai(_chat(), chat=True)
    assert not plain.tool_history and plain.tools is None


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "tool", "content": "3"}],
        [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}],
        [{"role": "assistant", "tool_calls": {"id": "c"}}],
    ],
)
def test_malformed_tool_messages_are_refused(messages: list[Any]) -> None:
    with pytest.raises(RequestError) as err:
        parse_openai({"model": "m", "messages": messages}, chat=True)
    assert err.value.args[1] == "messages" and "messages[0]" in err.value.message


def test_tools_are_refused_on_completions_and_beside_a_json_schema() -> None:
    with pytest.raises(RequestError, match="'tools'"):
        parse_openai({"model": "m", "prompt": "x", "tools": [WEATHER]}, chat=False)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with pytest.raises(RequestError, match="cannot be combined"):
        parse_openai(_chat(tools=[WEATHER], response_format=fmt), chat=True)
    # tool_choice none: the tools call nothing, response_format holds
    assert parse_openai(_chat(tools=[WEATHER], tool_choice="none", response_format=fmt), chat=True).schema


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def test_the_call_schema_admits_calls_of_the_tools_only() -> None:
    plan = parse_tools({"tools": [WEATHER, ADD], "tool_choice": "required"})
    assert plan is not None
    schema = call_schema(plan)
    good = _calls({"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "add", "arguments": {}})
    jsonschema.validate(good, schema)
    for bad in (
        _calls(),
        _calls({"name": "get_weather", "arguments": {"town": "Oslo"}}),
        _calls({"name": "nope", "arguments": {}}),
        {"response": "hi"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    auto = call_schema(parse_tools({"tools": [WEATHER]}) or plan)
    jsonschema.validate({"response": "hi"}, auto)
    single = call_schema(parse_tools({"tools": [WEATHER, ADD], "parallel_tool_calls": False}) or plan)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, single)
    named = parse_tools(
        {"tools": [WEATHER, ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}}
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            _calls({"name": "get_weather", "arguments": {"city": "x"}}), call_schema(named or plan)
        )


def test_a_tools_references_still_resolve_inside_the_call_schema() -> None:
    pet = {
        "type": "object",
        "$defs": {
            "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}
        },
        "properties": {"pet": {"$ref": "#/$defs/pet"}, "more": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["pet"],
    }
    tool = {"type": "function", "function": {"name": "adopt", "parameters": pet}}
    plan = parse_tools({"tools": [WEATHER, tool], "tool_choice": "required"})
    assert plan is not None
    schema = call_schema(plan)
    ok = {"pet": {"kind": "cat"}, "more": [{"pet": {"kind": "dog"}}]}
    jsonschema.validate(_calls({"name": "adopt", "arguments": ok}), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_calls({"name": "adopt", "arguments": {"pet": {"kind": "cow"}}}), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            _calls({"name": "adopt", "arguments": {"pet": {"kind": "cat"}, "more": [{}]}}), schema
        )
    assert json.dumps(tool["function"]["parameters"]) == json.dumps(pet)  # the request's schema is untouched
