"""What ``milliserve bench --llm`` sends: an OpenAI-compatible endpoint and the
streaming request bodies, encoded once before the run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import orjson

from milliserve.bench.llm_prompts import Prompt
from milliserve.errors import ConfigError

__all__ = ["ENDPOINTS", "LlmTarget", "LlmWorkload", "build_llm_workload", "default_model", "parse_llm_target"]

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class LlmTarget:
    """``http(s)://host[:port][/prefix]``; a trailing ``/v1`` is the API's own."""

    scheme: str
    host: str
    port: int
    prefix: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"

    def url(self, path: str) -> str:
        return f"{self}{path}"


def parse_llm_target(url: str) -> LlmTarget:
    """Parse an endpoint URL; raises ConfigError naming what is wrong."""
    u = urlparse(url if "://" in url else f"http://{url}")
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"target {url!r} must look like http://host:port (an OpenAI-compatible server)")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"target {url!r} has a port that is not a number") from None
    prefix = u.path.rstrip("/").removesuffix("/v1")
    return LlmTarget(u.scheme, u.hostname, port, prefix)


@dataclass
class LlmWorkload:
    """Pre-encoded HTTP/1.1 requests for one endpoint, sent round-robin."""

    target: LlmTarget
    model: str
    endpoint: str  # "chat" or "completions"
    requests: list[bytes]  # head and body, ready to write
    timeout_s: float = 300.0

    @property
    def path(self) -> str:
        return self.target.prefix + ENDPOINTS[self.endpoint]


def _headers(target: LlmTarget, api_key: str | None) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def default_model(target: LlmTarget, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The first model ``GET /v1/models`` lists; ConfigError when there is none to ask."""
    url = target.url("/v1/models")
    req = urllib.request.Request(url, headers=_headers(target, api_key))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise ConfigError(f"GET {url} answered {exc.code}; give the model with --model") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot ask {url} for its models ({getattr(exc, 'reason', exc)}); give --model"
        ) from None
    models = doc.get("data") if isinstance(doc, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ConfigError(f"GET {url} lists no models; give the model with --model")
    return str(models[0]["id"])


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
    target: LlmTarget,
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
    host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
    headers = "".join(f"{k}: {v}\r\n" for k, v in _headers(target, api_key).items())
    requests = []
    for p in prompts:
        body = orjson.dumps(_body(p, model, endpoint, max_tokens, temperature, extra_body or {}))
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
        requests.append(head.encode() + body)
    return LlmWorkload(target, model, endpoint, requests, timeout_s)
