"""A traced request's record while it runs: the sampler's decision (``Sampled``), the
spans its servables and generations record (``RequestTrace``), found through the task's
``CURRENT_TRACE`` that only the front ends' tracing wrappers set (``observability/tracing.py``,
which makes the spans and exports them when the request ends). ``note_generation`` adds a
generation's span; without tracing it is one context-variable read.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

from milliserve.road import SpanLog

__all__ = ["CURRENT_TRACE", "RequestTrace", "Sampled", "note_generation"]

# the request being traced in this task (set by the front end's wrapper only)
CURRENT_TRACE: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar(
    "milliserve_trace", default=None
)


@dataclass(slots=True, eq=False)
class RequestTrace:
    """One request's spans while it runs: ``log`` holds the servables' spans (their times
    in ``time.perf_counter()`` seconds), ``first``/``last`` when the servables started and
    ended (the front end's parse and serialize fall outside them)."""

    start: float
    sampled: Sampled
    log: SpanLog = field(default_factory=SpanLog)
    first: float | None = None
    last: float | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class Sampled:
    """The sampler's yes for one request, taken when it arrives: its trace, its caller's
    span (None: it starts the trace), and what the sampler adds (trace state, attributes)."""

    trace_id: int
    parent: Any
    trace_state: Any
    attributes: Any


def note_generation(
    model: str,
    timing: dict[str, float] | None,
    usage: dict[str, int] | None,
    finish: str | None,
    error: BaseException | None = None,
) -> None:
    """A generation's span (``generate MODEL``) in the current request's trace, if any: its
    queue time and time to first token (from the engine's timing, in ms), its tokens and
    finish reason (OpenTelemetry's gen_ai attributes)."""
    trace = CURRENT_TRACE.get()
    if trace is None:
        return
    end = time.perf_counter()
    t = timing or {}
    total_ms = t.get("total_ms") or (end - trace.start) * 1e3
    start = max(trace.start, end - total_ms / 1e3)
    attributes: dict[str, Any] = {"gen_ai.operation.name": "generate", "gen_ai.request.model": model}
    if finish:
        attributes["gen_ai.response.finish_reasons"] = (finish,)
    if usage:
        attributes["gen_ai.usage.input_tokens"] = int(usage.get("prompt_tokens", 0))
        attributes["gen_ai.usage.output_tokens"] = int(usage.get("completion_tokens", 0))
    for key, value in t.items():
        if value is not None and value >= 0:
            attributes[f"milliserve.generation.{key}"] = float(value)
    if "ttft_ms" in t and t["ttft_ms"] is not None:
        attributes["gen_ai.server.time_to_first_token"] = float(t["ttft_ms"]) / 1e3
    if error is not None:
        attributes["error.type"] = type(error).__name__
    index = trace.log.add(f"generate {model}", start, end, attributes)
    queue = t.get("queue_ms")
    if queue:
        trace.log.spans.append(["queue", start, min(end, start + queue / 1e3), index, None])
    ttft = t.get("ttft_ms")
    if ttft:
        trace.log.spans.append(["first token", start, min(end, start + ttft / 1e3), index, None])
    trace.first = start if trace.first is None else min(trace.first, start)
    trace.last = end if trace.last is None else max(trace.last, end)
