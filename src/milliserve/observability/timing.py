"""Per-request stage timings as the ``Server-Timing`` header (HTTP) and trailing
metadata (gRPC) carry them: ``parse;dur=0.021, queue;dur=0.004, ..., total;dur=0.180``
with durations in milliseconds (W3C Server Timing)."""

from __future__ import annotations

from typing import Any

__all__ = ["STAGES", "finish_stages", "server_timing"]

STAGES = ("parse", "cache", "features", "preprocess", "queue", "infer", "ann", "postprocess", "serialize")


# the stages of a plain inference, in the order the runtime and front-ends record them:
# one formatting operation instead of one per stage (this runs on every request)
_PLAIN = ("parse", "queue", "infer", "serialize")
_PLAIN_TEMPLATE = "parse;dur=%.3f, queue;dur=%.3f, infer;dur=%.3f, serialize;dur=%.3f, total;dur=%.3f"


def server_timing(stages: dict[str, float], total_s: float) -> str:
    """The header value: known stages in request order, then any others, then the total."""
    if len(stages) == 4 and tuple(stages) == _PLAIN:
        return _PLAIN_TEMPLATE % (
            stages["parse"] * 1e3,
            stages["queue"] * 1e3,
            stages["infer"] * 1e3,
            stages["serialize"] * 1e3,
            total_s * 1e3,
        )
    keys = tuple(stages)
    found = _TEMPLATES.get(keys)
    if found is None:
        found = _template(keys)
    order, template = found
    return template % (*(stages[k] * 1e3 for k in order), total_s * 1e3)


# the header's format for each order of stage names seen (a pipeline's are the same on every
# request), bounded: stage names come from the server's own code, never from clients
_TEMPLATES: dict[tuple[str, ...], tuple[tuple[str, ...], str]] = {}


def _template(keys: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    order = tuple(k for k in STAGES if k in keys) + tuple(k for k in keys if k not in STAGES)
    template = "".join(f"{k.replace('%', '%%')};dur=%.3f, " for k in order) + "total;dur=%.3f"
    if len(_TEMPLATES) < 256:
        _TEMPLATES[keys] = (order, template)
    return order, template


def finish_stages(response: Any, decode_s: float, serialize_s: float, total_s: float) -> str:
    """What a front-end does once it has encoded an answer: add its own decoding to
    ``parse`` and its encoding as ``serialize``, record the stages, return the header value."""
    stages: dict[str, float] = response.timings
    stages["parse"] = stages.get("parse", 0.0) + decode_s
    stages["serialize"] = serialize_s
    if response.record_stages is not None:
        response.record_stages(stages)
    return server_timing(stages, total_s)
