"""What ``milliserve bench --llm`` sends: an OpenAI-compatible endpoint and the
streaming request bodies, encoded once before the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from milliserve.bench.llm_client import StreamingClient
from milliserve.bench.llm_prompts import Prompt
from milliserve.bench.openai_target import ApiTarget, api_headers
from milliserve.bench.records import Recorder
from milliserve.errors import ConfigError

__all__ = ["ENDPOINTS", "LlmWorkload", "build_llm_workload"]

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class LlmWorkload:
    """Pre-encoded HTTP/1.1 requests for one endpoint, sent round-robin."""

    target: ApiTarget
    model: str
    endpoint: str  # "chat" or "completions"
    requests: list[bytes]  # head and body, ready to write
    timeout_s: float = 300.0

    @property
    def path(self) -> str:
        return self.target.prefix + ENDPOINTS[self.endpoint]

    def client(self, rec: Recorder, finished: Callable[[int], None]) -> StreamingClient:
        return StreamingClient(self.target, self.timeout_s, self.requests, rec, finished)


def _body(
    prompt: Prompt, model: str, endpoint: str, max_tokens: int, temperature: float, extra: dict[str, Any]
) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        doc["messages"] = [{"role": r, "content": c} for r, c in prompt.messages]
    else:
        doc["prompt"] = prompt.text
    doc |= {
        "max_tokens": prompt.max_tokens or max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return doc | extra


def build_llm_workload(
    target: ApiTarget,
    model: str,
    prompts: list[Prompt],
    endpoint: str = "chat",
    max_tokens: int = 128,
    temperature: float = 0.0,
    extra_body: dict[str, Any] | None = None,
    api_key: str | None = None,
    timeout_s: float = 300.0,
) -> LlmWorkload:
    """Encode one streaming request per prompt. ``extra_body`` is merged into each body
    last (``{"ignore_eos": true}`` for vLLM, say). Raises ConfigError for an unknown
    endpoint, no prompts or a limit below 1."""
    if endpoint not in ENDPOINTS:
        raise ConfigError(f"--endpoint {endpoint!r}: give one of {sorted(ENDPOINTS)}")
    if not prompts:
        raise ConfigError("no prompts to send")
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {max_tokens}")
    path = target.prefix + ENDPOINTS[endpoint]
    host = target.host_header
    headers = "".join(f"{k}: {v}\r\n" for k, v in api_headers(api_key, "text/event-stream").items())
    requests = []
    for p in prompts:
        body = orjson.dumps(_body(p, model, endpoint, max_tokens, temperature, extra_body or {}))
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
        requests.append(head.encode() + body)
    return LlmWorkload(target, model, endpoint, requests, timeout_s)
