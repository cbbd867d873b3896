"""Tool calling for real: the openai SDK, unchanged, against the smollm2 example (whose
template has no call format of its own, so every call is held to its function's schema).
An agent loop runs to the model's answer; twenty tool schemas' calls, streamed and not,
all parse and validate with ``jsonschema``. The same weights with Qwen2.5's template (a
GGUF copy whose metadata says so) take the road of a template with a call format."""

from __future__ import annotations

import asyncio
import json
import struct
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
S = {"type": "string", "maxLength": 20}
N = {"type": "integer", "minimum": 0, "maximum": 999}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A closed object (OpenAI's strict mode asks for it; an open one lets a small model
    add keys until max_tokens)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


TOOLS: list[tuple[str, str, dict[str, Any]]] = [
    ("get_weather", "The weather in a city", _object({"city": S, "unit": {"enum": ["C", "F"]}})),
    ("add", "Add two whole numbers", _object({"a": N, "b": N})),
    ("send_email", "Send an email", _object({"to": S, "subject": S, "urgent": {"type": "boolean"}})),
    ("set_timer", "Start a timer", _object({"minutes": {"type": "number", "minimum": 0.5, "maximum": 90}})),
    (
        "tag_post",
        "Tag a post",
        _object({"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
    ),
    ("move", "Move a piece", _object({"to": _object({"x": N, "y": N})})),
    ("search", "Search the web", _object({"query": S, "limit": N}, ["query"])),
    ("no_args", "Take no arguments", _object({})),
    (
        "rate",
        "Rate a film",
        _object({"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "why": S}, ["stars"]),
    ),
    ("book_flight", "Book a flight", _object({"origin": S, "destination": S, "seats": N})),
    ("lookup_id", "Find an order", _object({"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}})),
    (
        "convert",
        "Convert money",
        _object({"amount": {"type": "number", "minimum": 0, "maximum": 10000}, "currency": {"const": "EUR"}}),
    ),
    (
        "answer",
        "Give an answer",
        _object(
            {"value": {"anyOf": [{"type": "integer", "maximum": 99}, {"type": "string", "maxLength": 9}]}}
        ),
    ),
    (
        "plan",
        "Plan steps",
        _object(
            {
                "steps": {
                    "type": "array",
                    "maxItems": 2,
                    "items": _object({"n": {"type": "integer", "maximum": 5}, "do": S}),
                }
            }
        ),
    ),
    (
        "remember",
        "Store a note",
        _object({"note": {"type": "string", "maxLength": 40}, "pinned": {"type": "boolean"}}),
    ),
    (
        "matrix",
        "Store a grid",
        _object(
            {
                "rows": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {"type": "array", "items": N, "minItems": 2, "maxItems": 2},
                }
            }
        ),
    ),
    (
        "adopt",
        "Adopt a pet",
        {
            "type": "object",
            "$defs": {"pet": _object({"kind": {"enum": ["cat", "dog"]}, "name": S})},
            "properties": {"pet": {"$ref": "#/$defs/pet"}},
            "required": ["pet"],
            "additionalProperties": False,
        },
    ),
    ("set_level", "Set a level", _object({"level": {"enum": ["low", "mid", "high"]}, "score": N})),
    (
        "add_user",
        "Create a user",
        _object({"user": _object({"first": S, "last": S}), "active": {"type": "boolean"}}),
    ),
    (
        "pick",
        "Pick items",
        _object({"items": {"type": "array", "maxItems": 3, "items": {"enum": ["a", "b", "c"]}}}),
    ),
]
PROMPTS = ["What is the weather in Paris?", "Please help me with this.", "Do it now.", "Go ahead."]


def _tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


SCHEMAS = {name: schema for name, _, schema in TOOLS}


# GGUF value types: the sizes of the fixed ones; 8 is a string, 9 an array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def _skip_value(buf: bytes, pos: int, kind: int) -> int:
    if kind == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if kind == ARRAY:
        item, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SIZES:
            return pos + n * _SIZES[item]
        for _ in range(n):
            pos = _skip_value(buf, pos, item)
        return pos
    return pos + _SIZES[kind]


def _with_template(src: Path, dst: Path, template: str) -> None:
    """A copy of the GGUF ``src`` whose chat template is ``template`` (its metadata
    rewritten, its tensors copied as they are, at the same alignment)."""
    buf = src.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and version >= 2
    pos, kvs, alignment = 24, [], 32
    for _ in range(n_kv):
        start = pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8 : pos + 8 + n].decode()
        (kind,) = struct.unpack_from("<I", buf, pos + 8 + n)
        pos = _skip_value(buf, pos + 12 + n, kind)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos - 4)
        if key == "tokenizer.chat_template":
            continue
        kvs.append(buf[start:pos])
    name, text = b"tokenizer.chat_template", template.encode()
    kvs.append(struct.pack("<Q", len(name)) + name + struct.pack("<IQ", STRING, len(text)) + text)
    infos = pos
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * dims + 4 + 8
    data = -(-pos // alignment) * alignment
    head = struct.pack("<4sIQQ", magic, version, n_tensors, len(kvs)) + b"".join(kvs) + buf[infos:pos]
    head += b"\0" * (-len(head) % alignment)
    dst.write_bytes(head + buf[data:])


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[ServerProcess]:
    """The smollm2 example without its TTFT budget (a loaded machine must not refuse the
    twenty requests sent at once)."""
    repo = tmp_path_factory.mktemp("tools")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "llama_cpp"\n')
    with ServerProcess(repo) as server:
        yield server


async def _streamed(client: openai.AsyncOpenAI, **kw: Any) -> tuple[list[dict[str, Any]], str, str]:
    """A streamed chat's calls, content and finish reason, checking the stream's shape: a
    call's first fragment carries its id and name, the later ones neither."""
    calls: dict[int, dict[str, Any]] = {}
    content, finish = "", ""
    async for chunk in await client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for tc in delta.tool_calls or []:
            fn = tc.function
            assert fn is not None
            if tc.index not in calls:
                assert tc.id and fn.name and tc.type == "function", tc
                calls[tc.index] = {"id": tc.id, "name": fn.name, "arguments": fn.arguments or ""}
            else:
                assert tc.id is None and fn.name is None, tc
                calls[tc.index]["arguments"] += fn.arguments or ""
    return [calls[i] for i in sorted(calls)], content, finish


async def _ask(client: openai.AsyncOpenAI, i: int) -> tuple[str, list[dict[str, Any]], str, str]:
    """Tool i, asked by name or as the one required call beside a second tool; streamed
    or not, in turn."""
    name, description, schema = TOOLS[i]
    other = TOOLS[(i + 7) % len(TOOLS)]
    named = i % 2 == 0
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "tools": [_tool(name, description, schema), _tool(*other)],
        "tool_choice": {"type": "function", "function": {"name": name}} if named else "required",
        "parallel_tool_calls": False,
        "max_tokens": 160,
        "temperature": 0,
    }
    if i % 4 < 2:
        calls, content, finish = await _streamed(client, **kw)
        return name, calls, content, finish
    out = await client.chat.completions.create(**kw)
    msg = out.choices[0].message
    got = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in msg.tool_calls or []
        if c.type == "function"
    ]
    return name, got, msg.content or "", out.choices[0].finish_reason


def test_twenty_tool_schemas_every_call_validates(llm_server: ServerProcess) -> None:
    """Sent together, so constrained sequences decode in the engine's shared batches."""
    assert len(TOOLS) == 20

    async def main() -> list[tuple[str, list[dict[str, Any]], str, str]]:
        url = f"http://{llm_server.http_url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=300) as client:
            return list(await asyncio.gather(*(_ask(client, i) for i in range(len(TOOLS)))))

    for i, (name, calls, content, finish) in enumerate(asyncio.run(main())):
        assert finish == "tool_calls" and not content, (i, finish, content)
        assert len(calls) == 1, (i, calls)
        call = calls[0]
        if i % 2 == 0:
            assert call["name"] == name
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        assert call["id"].startswith("call_")


def test_an_agent_loop_runs_to_the_answer(llm_server: ServerProcess) -> None:
    """The model asks for a tool, the test answers with a ``tool`` message, the model
    answers; the assistant's message goes back as the SDK returned it."""
    client = openai.OpenAI(
        base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0, timeout=300
    )
    tools: Any = [_tool(*TOOLS[0]), _tool(*TOOLS[1])]
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, tool_choice="required", max_tokens=80, temperature=0
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert calls
    messages.append(choice.message)
    for call in calls:
        assert call.type == "function"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        result = (
            "18 C and sunny"
            if call.function.name == "get_weather"
            else str(args.get("a", 0) + args.get("b", 0))
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    # the model may call again (auto); after two more rounds it must answer (none)
    for round_ in range(3):
        out = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=tools,
            tool_choice="auto" if round_ < 2 else "none",
            max_tokens=60,
            temperature=0,
        )
        msg = out.choices[0].message
        if not msg.tool_calls:
            break
        assert out.choices[0].finish_reason == "tool_calls"
        messages.append(msg)
        for call in msg.tool_calls:
            assert call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "done"})
    assert msg.content and not msg.tool_calls
    assert out.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_agent_loop(llm_server: ServerProcess) -> None:
    async def main() -> None:
        url = f"http://{llm_server.http_url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=300) as client:
            tools: Any = [_tool(*TOOLS[1])]
            messages: list[Any] = [{"role": "user", "content": "Add 2 and 3."}]
            calls, content, finish = await _streamed(
                client,
                model=MODEL,
                messages=messages,
                tools=tools,
                tool_choice="required",
                max_tokens=80,
                temperature=0,
            )
            assert finish == "tool_calls" and not content and calls
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                        for c in calls
                    ],
                }
            )
            for c in calls:
                args = json.loads(c["arguments"])
                jsonschema.validate(args, SCHEMAS["add"])
                messages.append(
                    {"role": "tool", "tool_call_id": c["id"], "content": str(args["a"] + args["b"])}
                )
            _, answer, finish = await _streamed(
                client,
                model=MODEL,
                messages=messages,
                tools=tools,
                tool_choice="none",
                max_tokens=40,
                temperature=0,
            )
            assert answer and finish in ("stop", "length")

    asyncio.run(main())


def test_auto_answers_with_content_or_valid_calls(llm_server: ServerProcess) -> None:
    """smollm2's template has no call format: auto is held to calls or a ``response``,
    and the answer's JSON wrapping never shows in the content."""

    async def main() -> None:
        url = f"http://{llm_server.http_url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=300) as client:
            for prompt in ("Hello! How are you?", "What is the weather in Oslo?"):
                calls, content, finish = await _streamed(
                    client,
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt}],
                    tools=[_tool(*TOOLS[0])],
                    max_tokens=60,
                    temperature=0,
                )
                if calls:
                    assert not content  # a call never shows as content, even cut short
                    # greedy answers differ between CPUs (AVX2 or AVX-512 kernels): a call
                    # may be cut by max_tokens on one, which is "length", as OpenAI's is
                    assert finish in ("tool_calls", "length")
                    if finish == "tool_calls":
                        for c in calls:
                            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS["get_weather"])
                else:
                    assert finish in ("stop", "length") and not content.startswith('{"')

    asyncio.run(main())


def test_parallel_calls_each_validate(llm_server: ServerProcess) -> None:
    client = openai.OpenAI(
        base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0, timeout=300
    )
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris and in Rome?"}],
        tools=[_tool(*TOOLS[0])],
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=200,
        temperature=0,
    )
    calls = out.choices[0].message.tool_calls or []
    assert calls and len({c.id for c in calls}) == len(calls)
    done = calls if out.choices[0].finish_reason == "tool_calls" else calls[:-1]  # the last may be cut
    for c in done:
        assert c.type == "function" and c.function.name == "get_weather"
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS["get_weather"])


@pytest.mark.parametrize(
    ("tools", "choice", "param", "says"),
    [
        (
            [_tool("f", "", {"type": "object", "properties": {"a": {"type": "strin"}}})],
            "required",
            "tools",
            "function 'f': 'tools[0].function.parameters' cannot be compiled: at '/properties/a'",
        ),
        ([_tool("f", "", {"type": "array"})], "required", "tools", "function 'f'"),
        (
            [{"type": "function", "function": {"description": "no name"}}],
            "auto",
            "tools",
            "tools[0].function.name",
        ),
        ([_tool(*TOOLS[0])], {"type": "function", "function": {"name": "nope"}}, "tool_choice", '"nope"'),
    ],
)
def test_a_bad_tool_or_choice_is_a_400_saying_which(
    llm_server: ServerProcess, tools: Any, choice: Any, param: str, says: str
) -> None:
    client = openai.OpenAI(base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            tools=tools,
            tool_choice=choice,
            max_tokens=8,
        )
    body: Any = err.value.body
    assert body["param"] == param and says in body["message"], body


QWEN25 = Path(__file__).parent.parent / "unit" / "llm" / "templates" / "qwen2.5-instruct.jinja"


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[ServerProcess]:
    """SmolLM2's weights with Qwen2.5's template, which has a call format of its own
    (``<tool_call>{...}</tool_call>``)."""
    repo = tmp_path_factory.mktemp("hermes")
    (repo / "qsmol" / "1").mkdir(parents=True)
    _with_template(
        llm_repo / MODEL / "1" / "model.gguf", repo / "qsmol" / "1" / "model.gguf", QWEN25.read_text()
    )
    (repo / "qsmol" / "config.pbtxt").write_text('name: "qsmol"\nbackend: "llama_cpp"\n')
    with ServerProcess(repo) as server:
        yield server


def test_a_template_with_a_call_format_renders_and_reads_its_own(hermes_server: ServerProcess) -> None:
    """The tools go into the template's ``<tools>`` block, past calls into its
    ``<tool_call>`` blocks; ``required`` is still held to the schema; ``auto`` answers in
    the template's format, never showing a tag as content (the 135M model answers in
    prose here: a call, when one comes, is parsed)."""
    client = openai.OpenAI(
        base_url=f"http://{hermes_server.http_url}/v1", api_key="x", max_retries=0, timeout=300
    )
    weather: Any = [_tool(*TOOLS[0])]
    history: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4 C"},
        {"role": "assistant", "content": "It is 4 C in Oslo."},
        {"role": "user", "content": "And in Paris?"},
    ]
    plain = client.chat.completions.create(model="qsmol", messages=history, max_tokens=1, temperature=0)
    with_tools = client.chat.completions.create(
        model="qsmol", messages=history, tools=weather, tool_choice="none", max_tokens=1, temperature=0
    )
    assert plain.usage is not None and with_tools.usage is not None
    assert with_tools.usage.prompt_tokens == plain.usage.prompt_tokens  # none: no tools rendered
    required = client.chat.completions.create(
        model="qsmol", messages=history, tools=weather, tool_choice="required", max_tokens=80, temperature=0
    )
    calls = required.choices[0].message.tool_calls or []
    assert required.choices[0].finish_reason == "tool_calls" and calls
    for call in calls:
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    assert required.usage is not None and required.usage.prompt_tokens > plain.usage.prompt_tokens + 50

    async def auto() -> tuple[list[dict[str, Any]], str, str]:
        url = f"http://{hermes_server.http_url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=300) as aclient:
            return await _streamed(
                aclient, model="qsmol", messages=history, tools=weather, max_tokens=60, temperature=0
            )

    calls_, content, finish = asyncio.run(auto())
    assert "<tool_call>" not in content
    for c in calls_:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS["get_weather"])
    assert finish == "tool_calls" if calls_ else finish in ("stop", "length")


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    unit: str = pydantic.Field(pattern="^(C|F)$")


def test_the_sdks_pydantic_tools_parse(llm_server: ServerProcess) -> None:
    """``client.chat.completions.parse`` with ``openai.pydantic_function_tool``: strict
    tools whose calls the SDK parses into the model."""
    client = openai.OpenAI(
        base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0, timeout=300
    )
    out = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    calls = out.choices[0].message.tool_calls or []
    assert calls and all(isinstance(c.function.parsed_arguments, GetWeather) for c in calls)
