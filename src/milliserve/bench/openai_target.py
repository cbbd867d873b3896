"""An OpenAI-compatible server to measure (the LLM and the embeddings modes): where it is,
the headers every request carries, and the model it serves when none is named."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse

from milliserve.errors import ConfigError

__all__ = ["ApiTarget", "api_headers", "default_embedding_model", "default_model", "parse_api_target"]


@dataclass(frozen=True)
class ApiTarget:
    """``http(s)://host[:port][/prefix]``; a trailing ``/v1`` is the API's own."""

    scheme: str
    host: str
    port: int
    prefix: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"

    def url(self, path: str) -> str:
        return f"{self}{path}"

    @property
    def host_header(self) -> str:
        return self.host if self.port in (80, 443) else f"{self.host}:{self.port}"


def parse_api_target(url: str) -> ApiTarget:
    """Parse an endpoint URL; raises ConfigError naming what is wrong."""
    u = urlparse(url if "://" in url else f"http://{url}")
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"target {url!r} must look like http://host:port (an OpenAI-compatible server)")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"target {url!r} has a port that is not a number") from None
    prefix = u.path.rstrip("/").removesuffix("/v1")
    return ApiTarget(u.scheme, u.hostname, port, prefix)


def api_headers(api_key: str | None, accept: str = "application/json") -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": accept}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _models(target: ApiTarget, api_key: str | None, timeout_s: float) -> list[str]:
    url = target.url("/v1/models")
    req = urllib.request.Request(url, headers=api_headers(api_key))
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
    names = [str(m["id"]) for m in models or [] if isinstance(m, dict) and "id" in m]
    if not names:
        raise ConfigError(f"GET {url} lists no models; give the model with --model")
    return names


def default_model(target: ApiTarget, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The first model ``GET /v1/models`` lists; ConfigError when there is none to ask."""
    return _models(target, api_key, timeout_s)[0]


def default_embedding_model(target: ApiTarget, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The first model ``GET /v1/models`` lists that embeds a text (``/v1/models`` does not
    say which models embed: a server may list generative ones first). ConfigError when none
    does."""
    names = _models(target, api_key, timeout_s)
    for name in names:
        body = json.dumps({"model": name, "input": "which model embeds?"}).encode()
        req = urllib.request.Request(target.url("/v1/embeddings"), body, api_headers(api_key))
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                if r.status == 200:
                    return name
        except (urllib.error.URLError, OSError):
            continue
    raise ConfigError(f"none of the models {target} lists ({', '.join(names)}) embeds a text; give --model")
