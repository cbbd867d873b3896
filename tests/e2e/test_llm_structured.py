"""Structured output for real: ``response_format`` with the openai SDK against the smollm2
example; every answer parsed and validated with ``jsonschema``. Greedy and bounded
schemas keep the answers short."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = "smollm2"
S = {"type": "string", "maxLength": 24}

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {
        "type": "object",
        "properties": {"price": {"type": "number", "minimum": 0.5, "maximum": 99}},
        "required": ["price"],
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -10, "maximum": 10},
                    "y": {"type": "integer", "minimum": -10, "maximum": 10},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "required": ["point"],
    },
    {"type": "object", "properties": {"title": S, "subtitle": S}, "required": ["title"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}, "do": S},
                    "required": ["n", "do"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["steps"],
    },
    {
        "type": "object",
        "properties": {
            "level": {"type": "string", "enum": ["low", "mid", "high"]},
            "score": {"type": "integer", "minimum": 0, "maximum": 10},
        },
        "required": ["level", "score"],
    },
    {
        "type": "object",
        "properties": {
            "answer": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 99},
                    {"type": "string", "maxLength": 10},
                ]
            }
        },
        "required": ["answer"],
    },
    {
        "type": "object",
        "properties": {
            "city": S,
            "country": {"type": "string", "maxLength": 12},
            "population": {"type": "integer", "minimum": 0, "maximum": 50000000},
        },
        "required": ["city", "country", "population"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
        "required": ["id"],
    },
    {
        "type": "object",
        "properties": {"yes": {"type": "boolean"}, "why": {"type": "string", "maxLength": 30}},
        "required": ["yes"],
    },
    {
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 2,
                    "maxItems": 2,
                },
            }
        },
        "required": ["matrix"],
    },
    {
        "type": "object",
        "$defs": {
            "pet": {
                "type": "object",
                "properties": {"kind": {"enum": ["cat", "dog"]}, "name": S},
                "required": ["kind", "name"],
                "additionalProperties": False,
            }
        },
        "properties": {"pet": {"$ref": "#/$defs/pet"}},
        "required": ["pet"],
    },
    {
        "type": "object",
        "properties": {"temp_c": {"type": "number", "minimum": -50, "maximum": 60}, "unit": {"const": "C"}},
        "required": ["temp_c", "unit"],
    },
    {
        "type": "object",
        "properties": {"rating": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "comment": S},
        "required": ["rating"],
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"first": S, "last": S, "email": {"type": "string", "maxLength": 30}},
                "required": ["first", "last"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    {
        "type": "object",
        "properties": {
            "items": {"type": "array", "maxItems": 3, "items": {"enum": ["a", "b", "c"]}},
            "count": {"type": "integer", "minimum": 0, "maximum": 3},
        },
        "required": ["items", "count"],
    },
]


def _closed(schema: Any) -> Any:
    """Objects without ``additionalProperties`` get ``false``, as OpenAI's strict mode asks
    (open objects let a small model add keys until max_tokens)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if out.get("type") == "object" and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


SCHEMAS = [_closed(s) for s in SCHEMAS]
PROMPTS = ["Describe a person.", "Pick a colour.", "Answer yes or no.", "Give a price.", "Tag this post."]


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[ServerProcess]:
    """The smollm2 example without its TTFT budget (a loaded machine must not refuse the
    twenty requests sent at once)."""
    repo = tmp_path_factory.mktemp("structured")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "llama_cpp"\n')
    with ServerProcess(repo) as server:
        yield server


async def _ask(client: openai.AsyncOpenAI, i: int, schema: dict[str, Any]) -> tuple[str, str]:
    """Schema i, asked four ways in turn: chat or completion, streamed or not."""
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    prompt = PROMPTS[i % len(PROMPTS)] + " Answer in JSON."
    chat, stream = i % 2 == 0, i % 4 < 2
    if chat:
        messages: Any = [{"role": "user", "content": prompt}]
        if stream:
            parts, finish = [], ""
            async for c in await client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=120,
                temperature=0,
                stream=True,
                response_format=fmt,
            ):
                if c.choices:
                    parts.append(c.choices[0].delta.content or "")
                    finish = c.choices[0].finish_reason or finish
            return "".join(parts), finish
        out = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=120, temperature=0, response_format=fmt
        )
        return out.choices[0].message.content or "", out.choices[0].finish_reason
    extra = {"response_format": fmt}
    if stream:
        parts, finish = [], ""
        async for c in await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=120, temperature=0, stream=True, extra_body=extra
        ):
            if c.choices:
                parts.append(c.choices[0].text)
                finish = c.choices[0].finish_reason or finish
        return "".join(parts), finish
    done = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=120, temperature=0, extra_body=extra
    )
    return done.choices[0].text, done.choices[0].finish_reason


def test_twenty_schemas_every_answer_validates(llm_server: ServerProcess) -> None:
    """Sent together, so constrained sequences decode in the engine's shared batches."""
    assert len(SCHEMAS) == 20

    async def main() -> list[tuple[str, str]]:
        url = f"http://{llm_server.http_url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=300) as client:
            return list(await asyncio.gather(*(_ask(client, i, s) for i, s in enumerate(SCHEMAS))))

    answers = asyncio.run(main())
    cut = [(i, text) for i, (text, finish) in enumerate(answers) if finish != "stop"]
    assert not cut, cut
    for (text, _), schema in zip(answers, SCHEMAS, strict=True):
        jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_and_plain_text(llm_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object with a key 'a'."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = out.choices[0].message.content or ""
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut at max_tokens: a beginning of an object, as OpenAI's JSON mode can be
        assert text.startswith("{")
    plain = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
        response_format={"type": "text"},
    )
    assert plain.choices[0].message.content


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "/properties/a"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "(("}}},
            },
            "/properties/a/items",
        ),
        ({"type": "object", "properties": {"b": {"$ref": "#/$defs/missing"}}}, "/properties/b"),
        (
            {"type": "object", "properties": {"c": {"type": "object", "if": {"type": "object"}}}},
            "/properties/c",
        ),
    ],
)
def test_a_schema_that_cannot_compile_is_a_400_naming_the_part(
    llm_server: ServerProcess, schema: dict[str, Any], where: str
) -> None:
    client = openai.OpenAI(base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    body: Any = err.value.body
    assert body["param"] == "response_format"
    if where:
        assert f"at '{where}'" in body["message"], body["message"]


def test_a_constrained_stream_decodes_beside_a_free_one(llm_server: ServerProcess) -> None:
    """Both streams have their first token before either ends: they share steps."""

    async def main() -> tuple[list[float], list[float]]:
        client = openai.AsyncOpenAI(base_url=f"http://{llm_server.http_url}/v1", api_key="x", max_retries=0)
        firsts: list[float] = []
        ends: list[float] = []
        fmt = {
            "type": "json_schema",
            "json_schema": {
                "name": "l",
                "schema": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 20,
                    "maxItems": 30,
                },
            },
        }

        async def one(constrained: bool) -> None:
            kw: dict[str, Any] = (
                {"response_format": fmt} if constrained else {"extra_body": {"ignore_eos": True}}
            )
            seen = False
            async for c in await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "List thirty digits."}],
                max_tokens=60,
                temperature=0,
                stream=True,
                **kw,
            ):
                if not seen and c.choices and c.choices[0].delta.content:
                    firsts.append(time.monotonic())
                    seen = True
            ends.append(time.monotonic())

        await asyncio.gather(one(True), one(False))
        await client.close()
        return firsts, ends

    firsts, ends = asyncio.run(main())
    assert len(firsts) == 2 and max(firsts) < min(ends)
