"""What ``milliserve bench --embeddings`` sends: OpenAI's ``POST /v1/embeddings`` with
``inputs`` texts per request, encoded once before the run, to any OpenAI-compatible server
(milliserve's embedding pipelines, infinity-emb, vLLM, TEI's OpenAI route).

Texts come from a built-in set of sentences of varied length (a query of three words to a
paragraph) or from a file, one text per line; request i carries texts ``i*k .. i*k+k-1``
(round-robin), so consecutive requests differ and a response cache, if the server has one,
meets only what the texts repeat. ``extra_body`` is merged into every body last
(``{"encoding_format": "base64"}``, ``{"dimensions": 128}``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from milliserve.bench.http_client import HttpClient, HttpRequests
from milliserve.bench.openai_target import ApiTarget, api_headers
from milliserve.bench.records import Recorder
from milliserve.bench.text_stream import read_texts
from milliserve.errors import ConfigError

__all__ = ["BUILTIN_TEXTS", "PATH", "EmbeddingsWorkload", "build_embeddings_workload", "load_texts"]

PATH = "/v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_BODIES = 1000

BUILTIN_TEXTS = [
    "cheap flights to lisbon",
    "how do I reset my router",
    "The quarterly report shows revenue up 12% on the year, driven by the new subscription tier.",
    "best pizza near me open now",
    "Patients who received the vaccine showed a lower rate of hospitalisation over six months.",
    "what is the capital of australia",
    "I ordered the blue one but the package had a red one in it, and the return form asks for "
    "an order number that my confirmation email does not show anywhere.",
    "python sort a list of dicts by a key",
    "A gentle breeze moved through the olive trees as the sun went down over the hills.",
    "error 0x80070005 access denied when installing updates",
    "symptoms of vitamin d deficiency",
    "The committee will meet on Thursday to review the budget, the hiring plan and the office "
    "move, and will publish its minutes the following week.",
    "refund policy",
    "Transformers encode each token in the context of every other token of the sequence.",
    "weather tomorrow",
    "How long does it take for a letter posted today to reach Canada by standard mail?",
]


@dataclass
class EmbeddingsWorkload:
    """Pre-encoded HTTP/1.1 requests to ``/v1/embeddings``, sent round-robin."""

    target: ApiTarget
    model: str
    inputs: int  # texts per request
    requests: list[bytes]  # head and body, ready to write

    def client(self, rec: Recorder, finished: Callable[[int], None]) -> HttpClient:
        t = self.target
        return HttpClient(HttpRequests(t.host, t.port, [(r,) for r in self.requests]), rec, finished)


def load_texts(spec: str) -> list[str]:
    """``builtin`` (the sentences above) or a text file, one text per line."""
    if spec == "builtin":
        return list(BUILTIN_TEXTS)
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"--data {spec!r}: give builtin or a text file, one text per line")
    return read_texts(path)


def build_embeddings_workload(
    target: ApiTarget,
    model: str,
    texts: list[str],
    inputs: int = 1,
    extra_body: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> EmbeddingsWorkload:
    """Encode the requests: ``inputs`` texts each, as many bodies as it takes to send every
    text once (at most MAX_BODIES). Raises ConfigError for https (this client speaks plain
    HTTP), no texts, or an ``inputs`` outside 1..2048."""
    if target.scheme != "http":
        raise ConfigError(f"{target}: the embeddings mode speaks plain HTTP; give an http:// target")
    if not texts:
        raise ConfigError("no texts to embed")
    if not 1 <= inputs <= MAX_INPUTS:
        raise ConfigError(f"--batch-size {inputs}: give 1 to {MAX_INPUTS} texts per request")
    headers = "".join(f"{k}: {v}\r\n" for k, v in api_headers(api_key).items())
    count = min(MAX_BODIES, max(1, -(-len(texts) // inputs)))
    requests = []
    for i in range(count):
        batch = [texts[(i * inputs + j) % len(texts)] for j in range(inputs)]
        doc: dict[str, Any] = {"model": model, "input": batch, "encoding_format": "float"}
        body = orjson.dumps(doc | (extra_body or {}))
        head = f"POST {target.prefix}{PATH} HTTP/1.1\r\nHost: {target.host_header}\r\n{headers}"
        requests.append(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return EmbeddingsWorkload(target, model, inputs, requests)
