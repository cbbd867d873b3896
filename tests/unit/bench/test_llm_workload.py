"""Prompts (built-in sets and files) and the streaming requests built from them."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from milliserve.bench.llm_prompts import BUILTIN_SETS, load_prompts
from milliserve.bench.llm_workload import build_llm_workload
from milliserve.bench.openai_target import parse_api_target
from milliserve.errors import ConfigError


def body(raw: bytes) -> dict[str, object]:
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(payload)
    return dict(orjson.loads(payload))


def test_the_builtin_sets() -> None:
    chat, summarise = load_prompts("builtin:chat"), load_prompts("builtin:summarise")
    assert len(chat) == 12 and len({p.text for p in chat}) == 12
    # summarise prompts quote an input text for the answer to reuse (speculative decoding)
    assert summarise and all(len(p.text) > 300 and "\n\n" in p.text for p in summarise)
    assert sum(p in chat for p in summarise) >= 3  # a few of them are in the chat set too
    assert set(BUILTIN_SETS) == {"chat", "summarise"}


def test_prompt_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}\n'
        "\n"
        '{"prompt": "Once upon", "max_tokens": 7}\n'
    )
    a, b = load_prompts(str(jsonl))
    assert a.messages == (("system", "Be brief."), ("user", "Hi")) and a.text == "Hi"
    assert b.text == "Once upon" and b.max_tokens == 7
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\n  second prompt  \n")
    assert [p.text for p in load_prompts(str(txt))] == ["first prompt", "second prompt"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"messages": [{"role": "user"}]}', "needs a string 'role' and 'content'"),
        ('{"prompt": "a"}\nnot json', "p.jsonl:2: not JSON"),
        ('{"other": 1}', "expected 'messages'"),
        ('{"prompt": "a", "max_tokens": 0}', "'max_tokens' must be a positive integer"),
        ("", "no prompts in it"),
    ],
)
def test_bad_prompt_files_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_prompts(str(path))


def test_unknown_sets_and_missing_files() -> None:
    with pytest.raises(ConfigError, match="unknown set; give one of"):
        load_prompts("builtin:poems")
    with pytest.raises(ConfigError, match=re.escape("neither builtin:chat|builtin:summarise nor a file")):
        load_prompts("/nonexistent/prompts.jsonl")


def test_targets() -> None:
    t = parse_api_target("http://127.0.0.1:8000/v1")
    assert (t.scheme, t.host, t.port, t.prefix) == ("http", "127.0.0.1", 8000, "")
    assert parse_api_target("https://api.example.com/proxy/v1/").prefix == "/proxy"
    assert parse_api_target("https://api.example.com").port == 443
    assert parse_api_target("localhost:9000").port == 9000
    with pytest.raises(ConfigError, match="must look like http://host:port"):
        parse_api_target("grpc://127.0.0.1:8001")


def test_requests_stream_with_usage_greedy_and_the_extra_body_last() -> None:
    target = parse_api_target("http://127.0.0.1:8000/proxy")
    prompts = load_prompts("builtin:chat")[:2]
    w = build_llm_workload(target, "m", prompts, extra_body={"ignore_eos": True, "temperature": 0.5})
    assert len(w.requests) == 2 and w.path == "/proxy/v1/chat/completions"
    head = w.requests[0].split(b"\r\n\r\n")[0].decode()
    assert head.startswith("POST /proxy/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000")
    doc = body(w.requests[0])
    assert doc["model"] == "m" and doc["stream"] is True and doc["max_tokens"] == 128
    assert doc["stream_options"] == {"include_usage": True}
    assert doc["ignore_eos"] is True and doc["temperature"] == 0.5  # the extra body wins
    assert doc["messages"] == [{"role": "user", "content": prompts[0].text}]
    c = build_llm_workload(target, "m", prompts, endpoint="completions", max_tokens=16, api_key="k")
    doc = body(c.requests[1])
    assert doc["prompt"] == prompts[1].text and doc["temperature"] == 0.0 and doc["max_tokens"] == 16
    assert b"Authorization: Bearer k\r\n" in c.requests[1]


def test_bad_workloads_are_named() -> None:
    target = parse_api_target("http://127.0.0.1:8000")
    with pytest.raises(ConfigError, match="--endpoint 'embeddings'"):
        build_llm_workload(target, "m", load_prompts("builtin:chat"), endpoint="embeddings")
    with pytest.raises(ConfigError, match="--max-tokens must be >= 1"):
        build_llm_workload(target, "m", load_prompts("builtin:chat"), max_tokens=0)
