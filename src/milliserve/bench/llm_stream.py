"""What one OpenAI-style streamed completion delivered, read event by event.

Each SSE event's JSON is a chunk of ``/v1/chat/completions`` (``choices[].delta``)
or ``/v1/completions`` (``choices[].text``). A *content chunk* is one that carries
generated text (``delta.content``, ``delta.reasoning_content`` or ``text``) that is
not empty: the first one marks the time to first token, the gaps between them are
the inter-token latencies. How many tokens the answer had comes from the final
``usage`` (``stream_options.include_usage``) when the server sends it, else it is the
number of content chunks. When chunks carry cumulative usage (vLLM's
``continuous_usage_stats``), each chunk's own token count is known too.

Anything a server adds that a benchmark can use to explain a number is kept as
``timings``: llama.cpp's ``timings`` object (``prompt_ms``, ``predicted_ms``, ...),
the response's ``Server-Timing`` header (``queue;dur=1.2``, in ms) or the same value
in a chunk's ``server_timing`` (milliserve sends it with the usage, once the answer is
complete), and the usage's token details (``accepted_prediction_tokens`` and
``rejected_prediction_tokens`` of speculative decoding, ``cached_tokens``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from milliserve.bench.sse import SseEvent

__all__ = ["StreamTally", "parse_server_timing"]


def parse_server_timing(value: str) -> dict[str, float]:
    """``queue;dur=1.5, infer;desc="x";dur=3`` -> {"queue": 1.5, "infer": 3.0} (ms)."""
    out: dict[str, float] = {}
    for entry in value.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for p in params:
            k, _, v = p.partition("=")
            if name and k.strip().lower() == "dur":
                with contextlib.suppress(ValueError):
                    out[name] = float(v.strip().strip('"'))
    return out


def _text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        parts = (delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"))
        return "".join(p for p in parts if isinstance(p, str))
    text = choice.get("text")
    return text if isinstance(text, str) else ""


@dataclass
class StreamTally:
    """Fold a response's SSE events into the figures of one request."""

    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # its tokens, where cumulative usage said
    completion_tokens: int | None = None  # the last usage seen
    prompt_tokens: int | None = None
    done: bool = False  # data: [DONE] arrived
    finish_reason: str | None = None
    error: str | None = None  # an error object sent inside the stream
    timings: dict[str, float] = field(default_factory=dict)
    bad_events: int = 0  # data that was neither JSON nor [DONE]
    _usage_at_last_chunk: int = 0

    def add(self, event: SseEvent) -> None:
        data = event.data.strip()
        if not data:
            return
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.bad_events += 1
            return
        if not isinstance(chunk, dict):
            self.bad_events += 1
            return
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = str(msg)[:300]
            return
        usage = chunk.get("usage")
        used = usage.get("completion_tokens") if isinstance(usage, dict) else None
        choices = chunk.get("choices") or []
        text = "".join(_text(c) for c in choices if isinstance(c, dict))
        for c in choices:
            if isinstance(c, dict) and c.get("finish_reason"):
                self.finish_reason = str(c["finish_reason"])
        if text:
            self.chunk_times.append(event.t)
            if isinstance(used, int):  # cumulative usage on a content chunk: its own count
                self.chunk_tokens.append(max(1, used - self._usage_at_last_chunk))
                self._usage_at_last_chunk = used
        if isinstance(used, int):
            self.completion_tokens = used
            prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if isinstance(prompt, int):
                self.prompt_tokens = prompt
        self._explain(chunk, usage)

    def _explain(self, chunk: dict[str, Any], usage: Any) -> None:
        """Keep what the server says about its own time and work."""
        for prefix, doc in (
            ("timings", chunk.get("timings")),
            ("usage", usage.get("completion_tokens_details") if isinstance(usage, dict) else None),
            ("usage", usage.get("prompt_tokens_details") if isinstance(usage, dict) else None),
        ):
            if isinstance(doc, dict):
                for k, v in doc.items():
                    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                        self.timings[f"{prefix}.{k}"] = float(v)
        timing = chunk.get("server_timing")  # milliserve's: the Server-Timing value, in the last chunk
        if isinstance(timing, str):
            for k, v in parse_server_timing(timing).items():
                self.timings[f"server-timing.{k}"] = v

    @property
    def output_tokens(self) -> int:
        """Tokens generated: the server's usage when it sent one, else one per content chunk."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)

    def per_chunk_tokens(self) -> list[float]:
        """Each content chunk's share of the output: its own count where every chunk carried
        cumulative usage, else the total spread evenly (one each without a usage)."""
        n = len(self.chunk_times)
        if not n:
            return []
        if len(self.chunk_tokens) == n:
            return [float(k) for k in self.chunk_tokens]
        return [self.output_tokens / n] * n
