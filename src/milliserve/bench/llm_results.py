"""Turn the LLM mode's request records into the numbers it reports.

Latency figures describe the *measured* requests (those scheduled after the warmup):
TTFT from each request's scheduled instant to its first content chunk, ITL between
its successive content chunks, TPOT = (end - first chunk) / (tokens - 1), and the
end-to-end latency. In an open loop the scheduled instant is the intended send, so a
request that waited for the client is charged for it (coordinated omission).

Rates are taken over the *span* of the measured requests, from the first one's
scheduled instant to the last one's end. The load is the same all through it: the
warmup's requests are still running as it opens, and the cooldown keeps the load up
until it closes. Requests/s counts every successful completion in the span and
output tokens/s the tokens of every content chunk that arrived in it, whichever
phase their request was in, so that neither the ramp at the start nor the drain at
the end biases them.

A request is good when it succeeded and met both objectives: TTFT <= ``slo_ttft_ms`` and
the p99 of that request's own ITLs <= ``slo_itl_ms`` (a request with fewer than two
content chunks has no ITL and meets that one). A request that succeeded without any
content meets neither. In an open loop goodput is the measured good requests over the
measured schedule (``offered_s``: the seconds their arrivals were drawn for), the rate
of arrivals that were served well: it cannot pass the arrival rate, and a level with few
arrivals is not made faster by the short span they happened to fall in. In a closed loop,
which has no schedule, it is requests/s times the good share of the measured successes.

ITL is per content chunk: a chunk that carries several tokens (speculative decoding,
a server that batches its writes) is one gap, as the reader sees it, unless the
server says per chunk how many tokens it carried (cumulative usage on each chunk),
when the gap is spread evenly over them. TPOT is per token either way, and
``tokens_per_chunk`` shows when the two differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.bench.llm_client import BAD_RESPONSE, STREAM_CUT, STREAM_ERROR, TIMEOUT
from milliserve.bench.records import Records
from milliserve.bench.results import client_cpu_share, errors_by_kind, hdr_percentiles, lateness, level_label
from milliserve.percentiles import percentile

__all__ = ["ERROR_KINDS", "LlmLevelResult", "Slo", "request_itls", "summarize_llm"]

ERROR_KINDS = {
    STREAM_CUT: "stream cut",
    TIMEOUT: "timeout",
    STREAM_ERROR: "error in stream",
    BAD_RESPONSE: "bad response",
}


@dataclass(frozen=True)
class Slo:
    ttft_ms: float = 1000.0
    itl_ms: float = 100.0


@dataclass
class LlmLevelResult:
    """One load level (a concurrency or a rate) of the LLM mode."""

    mode: str
    level: float
    duration_s: float  # the span the rates were taken over
    requests: int  # measured
    ok: int
    throughput: float  # successful requests/s
    goodput: float  # requests/s that met both objectives
    good_share: float  # of the measured successful requests
    output_tokens_per_s: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    tpot_ms: dict[str, float]
    e2e_ms: dict[str, float]
    output_tokens: dict[str, float]  # per successful request: mean, p50, max, total
    tokens_per_chunk: float
    usage_reported: float  # share of successful requests whose server reported usage
    empty: int  # successful, but without a content chunk
    errors: dict[str, int]
    late_sends: int
    late_send_p99_ms: float
    client_cpu_share: float
    slo: Slo
    # of the successful requests with content: those over the TTFT objective, and those over
    # the ITL one (a request can miss both); why goodput is short of throughput
    missed_ttft: int = 0
    missed_itl: int = 0
    server: dict[str, float] | None = None
    # for plots only (not serialised): each measured request's TTFT and all ITLs, in ms
    samples: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return level_label(self.mode, self.level)

    def as_dict(self) -> dict[str, Any]:
        def r(d: dict[str, float]) -> dict[str, float]:
            return {k: round(v, 3) for k, v in d.items()}

        return {
            "mode": self.mode,
            "level": self.level,
            "duration_s": round(self.duration_s, 3),
            "requests": self.requests,
            "ok": self.ok,
            "throughput": round(self.throughput, 3),
            "goodput": round(self.goodput, 3),
            "good_share": round(self.good_share, 4),
            "missed": {"ttft": self.missed_ttft, "itl": self.missed_itl},
            "output_tokens_per_s": round(self.output_tokens_per_s, 2),
            "ttft_ms": r(self.ttft_ms),
            "itl_ms": r(self.itl_ms),
            "tpot_ms": r(self.tpot_ms),
            "e2e_ms": r(self.e2e_ms),
            "output_tokens": r(self.output_tokens),
            "tokens_per_chunk": round(self.tokens_per_chunk, 3),
            "usage_reported": round(self.usage_reported, 3),
            "empty": self.empty,
            "errors": self.errors,
            "late_sends": self.late_sends,
            "late_send_p99_ms": round(self.late_send_p99_ms, 3),
            "client_cpu_share": round(self.client_cpu_share, 3),
            "slo": {
                "ttft_ms": self.slo.ttft_ms,
                "itl_ms": self.slo.itl_ms,
                "itl_statistic": "p99 per request",
            },
            "server": self.server,
        }


def request_itls(
    times: np.ndarray[Any, Any], tokens: np.ndarray[Any, Any], known: bool
) -> np.ndarray[Any, Any]:
    """A request's inter-token latencies (s) from its content chunks' arrivals: one per gap,
    or, when the server said how many tokens each chunk carried, each gap spread evenly
    over that chunk's tokens."""
    gaps = np.diff(times)
    if not known or not gaps.size:
        return gaps
    k = np.maximum(np.rint(tokens[1:]).astype(np.int64), 1)
    return np.repeat(gaps / k, k)


def _ms(values_s: np.ndarray[Any, Any]) -> dict[str, float]:
    pct, _ = hdr_percentiles(np.asarray(values_s) * 1e6)
    return {k: v / 1e3 for k, v in pct.items()}


def summarize_llm(
    mode: str, level: float, rec: Records, cores: int, run_s: float, slo: Slo, offered_s: float | None = None
) -> LlmLevelResult:
    """Summarise one level's records (see the module docstring for what each figure is);
    ``offered_s``: an open loop's measured schedule, in seconds."""
    if rec.streams is None:
        raise ValueError("the LLM figures need streamed records (Records.streams)")
    st = rec.streams
    m = rec.measured
    ok_all = rec.status == 200
    ok = m & ok_all
    idx = np.flatnonzero(ok)
    n_chunks = np.diff(st.offsets)
    first = np.full(len(rec), np.nan)
    has = n_chunks > 0
    first[has] = st.chunk_t[st.offsets[:-1][has]]

    ttft, e2e, tpot, itls = [], [], [], []
    good = missed_ttft = missed_itl = 0
    for i in idx:
        e2e.append(rec.done[i] - rec.intended[i])
        if not has[i]:
            continue
        a, b = st.offsets[i], st.offsets[i + 1]
        t_first = float(first[i] - rec.intended[i])
        ttft.append(t_first)
        gaps = request_itls(st.chunk_t[a:b], st.chunk_tokens[a:b], bool(st.chunk_known[i]))
        itls.append(gaps)
        if st.output_tokens[i] > 1:
            tpot.append((rec.done[i] - first[i]) / (st.output_tokens[i] - 1))
        itl_p99 = percentile(gaps, 99) if gaps.size else 0.0
        over_ttft, over_itl = t_first * 1e3 > slo.ttft_ms, itl_p99 * 1e3 > slo.itl_ms
        missed_ttft += over_ttft
        missed_itl += over_itl
        good += not (over_ttft or over_itl)
    all_itls = np.concatenate(itls) if itls else np.zeros(0)

    # the span of the measured requests, from the first one's schedule to the last one's
    # end; the load is the same all through it (warmup before, cooldown after)
    w0 = float(rec.intended[m].min()) if m.any() else 0.0
    w1 = float(rec.done[m].max()) if m.any() else 0.0
    window = w1 - w0
    chunk_ok = np.repeat(ok_all, n_chunks)
    completed = int((ok_all & (rec.done >= w0) & (rec.done <= w1)).sum())
    tokens = float(st.chunk_tokens[chunk_ok & (st.chunk_t >= w0) & (st.chunk_t <= w1)].sum())
    throughput = completed / window if window > 0 else 0.0
    good_share = good / ok.sum() if ok.any() else 0.0

    out = st.output_tokens[ok].astype(np.float64)
    chunks = n_chunks[ok]
    late, late_p99, _ = lateness(rec, m)
    return LlmLevelResult(
        mode=mode,
        level=level,
        duration_s=window,
        requests=int(m.sum()),
        ok=int(ok.sum()),
        throughput=throughput,
        goodput=good / offered_s if offered_s else throughput * good_share,
        good_share=float(good_share),
        output_tokens_per_s=tokens / window if window > 0 else 0.0,
        ttft_ms=_ms(np.asarray(ttft)),
        itl_ms=_ms(all_itls),
        tpot_ms=_ms(np.asarray(tpot)),
        e2e_ms=_ms(np.asarray(e2e)),
        output_tokens=(
            {
                "mean": float(out.mean()),
                "p50": percentile(out, 50),
                "max": float(out.max()),
                "total": float(out.sum()),
            }
            if out.size
            else {}
        ),
        tokens_per_chunk=float(out.sum() / chunks.sum()) if chunks.sum() else 0.0,
        usage_reported=float(st.usage_known[ok].mean()) if ok.any() else 0.0,
        empty=int((n_chunks[ok] == 0).sum()),
        errors=errors_by_kind(rec.status[m & ~ok_all], rec.messages, ERROR_KINDS),
        late_sends=late,
        late_send_p99_ms=late_p99,
        client_cpu_share=client_cpu_share(rec, run_s, cores),
        slo=slo,
        missed_ttft=missed_ttft,
        missed_itl=missed_itl,
        server=_server_timings([st.timings[i] for i in idx]),
        samples={"ttft_ms": np.asarray(ttft) * 1e3, "itl_ms": all_itls * 1e3},
    )


def _server_timings(timings: list[dict[str, float]]) -> dict[str, float] | None:
    """The mean of each timing the server reported, over the requests that reported it."""
    sums: dict[str, list[float]] = {}
    for t in timings:
        for k, v in t.items():
            sums.setdefault(k, []).append(v)
    return {k: round(float(np.mean(v)), 3) for k, v in sorted(sums.items())} or None
