"""Turn request records into the numbers a benchmark reports: the helpers every mode uses
(HDR percentiles, errors by kind, late sends, the client's CPU share) and the summary of the
request/response modes (tensors, embeddings). The LLM mode's figures build on these
(bench/llm_results.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from milliserve.bench.records import CONNECT_ERROR, Records
from milliserve.percentiles import percentiles

__all__ = [
    "LATE_SEND_S",
    "PERCENTILES",
    "LevelResult",
    "client_cpu_share",
    "error_key",
    "errors_by_kind",
    "find_stalls",
    "hdr_percentiles",
    "lateness",
    "level_label",
    "summarize",
]

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
# A send that leaves more than this after its scheduled instant counts as late.
LATE_SEND_S = 0.002


@dataclass
class LevelResult:
    """One load level (a concurrency or a rate) after its warmup."""

    mode: str
    level: float
    duration_s: float
    requests: int
    ok: int
    throughput: float
    latency_us: dict[str, float]
    errors: dict[str, int]
    late_sends: int
    late_send_p99_ms: float
    client_cpu_share: float
    late_send_p50_us: float = 0.0  # the open loop's sends after their schedule (its own delay)
    server: dict[str, float] | None = None
    windows: int = 1
    stable: bool = True
    stalls: list[dict[str, float]] = field(default_factory=list)
    inputs_per_s: float | None = None  # embeddings: texts embedded per second
    # for plots only (not serialised): schedule offset (s) and latency (µs) of each request
    timeline: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = field(default=None, repr=False)
    histogram: HdrHistogram | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return level_label(self.mode, self.level)

    def as_dict(self) -> dict[str, Any]:
        extra = {} if self.inputs_per_s is None else {"inputs_per_s": round(self.inputs_per_s, 2)}
        return extra | {
            "mode": self.mode,
            "level": self.level,
            "duration_s": round(self.duration_s, 3),
            "requests": self.requests,
            "ok": self.ok,
            "throughput": round(self.throughput, 2),
            "latency_us": {k: round(v, 1) for k, v in self.latency_us.items()},
            "errors": self.errors,
            "late_sends": self.late_sends,
            "late_send_p50_us": round(self.late_send_p50_us, 1),
            "late_send_p99_ms": round(self.late_send_p99_ms, 3),
            "client_cpu_share": round(self.client_cpu_share, 3),
            "server": self.server,
            "windows": self.windows,
            "stable": self.stable,
            "stalls": self.stalls,
        }


def level_label(mode: str, level: float) -> str:
    return f"concurrency {level:g}" if mode == "closed" else f"{level:g} req/s"


def hdr_percentiles(values_us: np.ndarray[Any, Any]) -> tuple[dict[str, float], HdrHistogram]:
    """PERCENTILES (nearest rank over every value: milliserve.percentiles), max and mean of
    ``values_us``, empty when there are no values; and the values in an HDR histogram (1 µs
    to 1 h, 3 significant digits), which keeps the distribution for whoever merges levels.
    The percentiles come from the values themselves, not from the histogram's buckets."""
    hist = HdrHistogram(1, 3_600_000_000, 3)
    for v in values_us:
        hist.record_value(min(max(int(v), 1), 3_600_000_000))
    if not values_us.size:
        return {}, hist
    pct = {f"p{p:g}": v for p, v in zip(PERCENTILES, percentiles(values_us, PERCENTILES), strict=True)}
    pct["max"] = float(np.max(values_us))
    pct["mean"] = float(np.mean(values_us))
    return pct, hist


def error_key(status: int, messages: dict[int, str], kinds: dict[int, str] | None = None) -> str:
    """``kind: first message`` for a status: ``http 503: ...``, ``connection: ...``, or
    the name ``kinds`` gives a client's own negative codes."""
    if kinds and status in kinds:
        kind = kinds[status]
    elif status == CONNECT_ERROR:
        kind = "connection"
    elif status >= 1000:
        import grpc

        code = next((c.name for c in grpc.StatusCode if c.value[0] == status - 1000), str(status - 1000))
        kind = f"grpc {code}"
    else:
        kind = f"http {status}"
    msg = messages.get(status, "")
    return f"{kind}: {msg}" if msg else kind


def errors_by_kind(
    statuses: np.ndarray[Any, Any], messages: dict[int, str], kinds: dict[int, str] | None = None
) -> dict[str, int]:
    """How many of the failed ``statuses`` fell to each kind (``error_key``)."""
    errors: dict[str, int] = {}
    for s in statuses:
        key = error_key(int(s), messages, kinds)
        errors[key] = errors.get(key, 0) + 1
    return errors


def lateness(rec: Records, keep: np.ndarray[Any, Any]) -> tuple[int, float, float]:
    """Of the requests ``keep`` selects: how many left more than LATE_SEND_S after their
    scheduled instant, the p99 of that lateness in ms and its p50 in µs."""
    late = (rec.sent - rec.intended)[keep]
    if not late.size:
        return 0, 0.0, 0.0
    p50, p99 = percentiles(late, [50, 99])
    return int((late > LATE_SEND_S).sum()), p99 * 1e3, p50 * 1e6


def client_cpu_share(rec: Records, run_s: float, cores: int) -> float:
    """The client processes' CPU time as a share of the machine over ``run_s``."""
    return rec.cpu_s / (run_s * cores) if run_s > 0 else 0.0


def find_stalls(
    offsets: np.ndarray[Any, Any], latency_us: np.ndarray[Any, Any], p50_us: float
) -> list[dict[str, float]]:
    """Episodes where requests took over 10x the median (and over 10 ms): a server stall
    (GC pause, lock, swap) shows up as a run of such requests close together in time."""
    slow = np.flatnonzero(latency_us > max(10 * p50_us, 10_000.0))
    episodes: list[dict[str, float]] = []
    for i in slow[np.argsort(offsets[slow])]:
        t = float(offsets[i])
        if episodes and t - episodes[-1]["end_s"] < 0.05:
            e = episodes[-1]
            e["end_s"], e["requests"] = t, e["requests"] + 1
            e["max_ms"] = max(e["max_ms"], float(latency_us[i]) / 1e3)
        else:
            episodes.append({"start_s": t, "end_s": t, "requests": 1, "max_ms": float(latency_us[i]) / 1e3})
    return [e for e in episodes if e["requests"] >= 2]


def summarize(
    mode: str,
    level: float,
    rec: Records,
    window_s: float,
    cores: int,
    run_s: float,
    windows: int = 1,
    stable: bool = True,
    inputs_per_request: int | None = None,
) -> LevelResult:
    """Summarise the measured requests, those scheduled in the level's measured window of
    ``window_s`` seconds (request/response modes).

    Latency runs from each request's scheduled instant, which in the open loop is the
    corrected latency; in the closed loop the schedule is the send. ``run_s`` is the wall
    time the workers ran (warmup included), for their CPU share; ``inputs_per_request``
    (embeddings) adds the inputs per second.
    """
    keep = rec.measured
    intended, done, status = rec.intended[keep], rec.done[keep], rec.status[keep]
    latency_us = np.maximum((done - intended) * 1e6, 1.0)
    ok = status == 200
    pct, hist = hdr_percentiles(latency_us[ok])
    late, late_p99, late_p50 = lateness(rec, keep)
    offsets = intended - (intended.min() if intended.size else 0.0)
    throughput = float(ok.sum() / window_s) if window_s > 0 else 0.0
    return LevelResult(
        mode=mode,
        level=level,
        duration_s=window_s,
        requests=int(keep.sum()),
        ok=int(ok.sum()),
        throughput=throughput,
        latency_us=pct,
        errors=errors_by_kind(status[~ok], rec.messages),
        late_sends=late,
        late_send_p99_ms=late_p99,
        late_send_p50_us=late_p50 if mode == "open" else 0.0,
        client_cpu_share=client_cpu_share(rec, run_s, cores),
        windows=windows,
        stable=stable,
        stalls=find_stalls(offsets[ok], latency_us[ok], pct.get("p50", 0.0)),
        inputs_per_s=None if inputs_per_request is None else throughput * inputs_per_request,
        timeline=(offsets, latency_us),
        histogram=hist,
    )
