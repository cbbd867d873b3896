"""The Responses API, stateless: a request as the chat it amounts to (what would need a
stored response refused by name), and the typed events and response object of an answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from milliserve.errors import RequestError
from milliserve.llm.tool_calls import CallArguments, CallStart
from milliserve.openai.response_events import ResponseEvents, response_echo
from milliserve.openai.responses import parse_responses

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_text_input_and_instructions_are_a_chat() -> None:
    p = parse_responses(
        {"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0}
    )
    assert p.messages is not None and [(m.role, m.content) for m in p.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]
    assert (p.max_tokens, p.temperature, p.tools, p.schema) == (9, 0.0, None, None)


def test_items_become_messages_calls_and_results() -> None:
    p = parse_responses(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo and Rome?"}]},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "Oslo"}',
                },
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "get_weather",
                    "arguments": '{"city": "Rome"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "4 C"},
                {"type": "function_call_output", "call_id": "c2", "output": "19 C"},
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
        }
    )
    assert p.messages is not None and [m.role for m in p.messages] == ["user", "assistant", "tool", "tool"]
    assert [c.id for c in p.messages[1].tool_calls] == ["c1", "c2"]
    assert p.tools is not None and p.tools.function == "get_weather" and not p.tools.parallel


def test_text_format_is_the_answers_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "x", "schema": schema, "strict": True}
    assert parse_responses({"model": "m", "input": "x", "text": {"format": fmt}}).schema == schema
    assert parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}).schema
    assert parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).schema is None


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"store": True}, "store", "stateless"),
        ({"conversation": "conv_1"}, "conversation", "stateless"),
        ({"background": True}, "background", "background"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "stateless"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
            "text",
        ),
        ({"input": []}, "input", "non-empty"),
        ({"tools": [{"type": "web_search"}]}, "tools", "only function tools"),
        ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({"frobnicate": 1}, "frobnicate", "unknown field"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "not supported"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
        (
            {"tools": [WEATHER], "text": {"format": {"type": "json_object"}}},
            "text",
            "'text.format' with a JSON schema and 'tools' cannot be combined",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input", "output"),
    ],
)
def test_what_needs_stored_state_or_is_not_honoured_is_refused(
    extra: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(RequestError) as err:
        parse_responses({"model": "m", "input": "x", **extra})
    assert err.value.args[1] == param and says in err.value.message, err.value.message


def test_events_follow_the_sdks_order_and_end_with_the_response() -> None:
    answer = ResponseEvents("m", response_echo({"tools": [WEATHER]}))
    events = answer.start()
    events += answer.feed(["Let me ", "check."])
    events += answer.feed(
        [CallStart(0, "call_1", "get_weather"), CallArguments(0, '{"city": '), CallArguments(0, '"Oslo"}')]
    )
    events += answer.finish(
        "stop", {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12, "cached_tokens": 2}
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = json.loads(json.dumps(events[-1]["response"]))
    assert final["status"] == "completed" and final["tools"] == [WEATHER]
    message, call = final["output"]
    assert message["content"][0]["text"] == "Let me check." and message["role"] == "assistant"
    assert call == {
        "type": "function_call",
        "id": call["id"],
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "status": "completed",
    }
    assert (
        final["usage"]["input_tokens_details"]["cached_tokens"] == 2 and final["usage"]["total_tokens"] == 12
    )
    assert events[9]["item"]["arguments"] == "" and events[2]["item"]["content"] == []


def test_an_answer_cut_by_max_output_tokens_is_incomplete() -> None:
    answer = ResponseEvents("m", response_echo({}))
    answer.feed(["Hel"])
    last = answer.finish("length", {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
