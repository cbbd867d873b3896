"""The Responses API for real: ``client.responses.create`` and ``client.responses.stream``
of the openai SDK, unchanged, against the smollm2 example; stateless (the conversation
goes back as ``input``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pydantic
import pytest

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = "smollm2"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[openai.OpenAI]:
    """The smollm2 example without its TTFT budget, and an SDK client of it."""
    repo = tmp_path_factory.mktemp("responses")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "llama_cpp"\n')
    with ServerProcess(repo) as server:
        sdk = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="x", max_retries=0, timeout=300)
        yield sdk
        sdk.close()


def test_text_in_text_out(client: openai.OpenAI) -> None:
    out = client.responses.create(
        model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=40, temperature=0
    )
    assert out.object == "response" and out.id.startswith("resp_") and out.output_text
    assert out.usage is not None and out.usage.output_tokens > 0 and out.usage.input_tokens > 0
    if out.status == "incomplete":
        assert out.incomplete_details is not None and out.incomplete_details.reason == "max_output_tokens"
    else:
        assert out.status == "completed"


def test_an_agent_loop_with_the_conversation_sent_back(client: openai.OpenAI) -> None:
    question: Any = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.responses.create(
        model=MODEL, input=[question], tools=[WEATHER], tool_choice="required", temperature=0
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and calls
    inputs: list[Any] = [question, *first.output]
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        inputs.append({"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"})
    answer = client.responses.create(
        model=MODEL, input=inputs, tools=[WEATHER], tool_choice="none", max_output_tokens=40, temperature=0
    )
    assert answer.output_text and not [o for o in answer.output if o.type == "function_call"]


def test_a_streamed_call_through_responses_stream(client: openai.OpenAI) -> None:
    kinds: list[str] = []
    arguments = ""
    with client.responses.stream(
        model=MODEL,
        input="What is the weather in Oslo?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                arguments += event.delta
        final = stream.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" not in kinds
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == arguments
    jsonschema.validate(json.loads(arguments), WEATHER["parameters"])


def test_streamed_text_adds_up_to_the_response(client: openai.OpenAI) -> None:
    deltas: list[str] = []
    last: Any = None
    for event in client.responses.create(
        model=MODEL, input="Name a colour.", max_output_tokens=24, temperature=0, stream=True
    ):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        last = event
    assert last is not None and last.type in ("response.completed", "response.incomplete")
    assert "".join(deltas) == last.response.output_text and deltas


def test_text_format_holds_the_answer_to_a_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    out = client.responses.create(
        model=MODEL,
        input="Describe a person in JSON.",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        max_output_tokens=60,
        temperature=0,
    )
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), schema)


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"previous_response_id": "resp_123"}, "previous_response_id"), ({"store": True}, "store")],
)
def test_stored_state_is_refused_with_a_400_saying_so(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=4, **extra)
    body: Any = err.value.body
    assert body["param"] == param and "stateless" in body["message"]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


def test_responses_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    out = client.responses.parse(
        model=MODEL, input="Describe a person.", text_format=Person, max_output_tokens=60, temperature=0
    )
    assert isinstance(out.output_parsed, Person)
