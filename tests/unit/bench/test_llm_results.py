"""The LLM mode's statistics from records whose every instant we chose: TTFT, ITL, TPOT,
end-to-end latency, rates over the measured span, and goodput against the objectives."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from milliserve.bench.llm_client import STREAM_CUT
from milliserve.bench.llm_results import Slo, request_itls, summarize_llm
from milliserve.bench.records import COOLDOWN, MEASURED, WARMUP, Records, Streams


@dataclass
class Req:
    intended: float
    done: float
    chunks: list[float] = field(default_factory=list)
    tokens: int | None = None  # the server's usage; None: not reported
    status: int = 200
    phase: int = MEASURED
    per_chunk: list[float] | None = None  # tokens of each chunk, when the server said


def records(reqs: list[Req], messages: dict[int, str] | None = None) -> Records:
    chunk_t: list[float] = []
    chunk_k: list[float] = []
    offsets = [0]
    for r in reqs:
        n = len(r.chunks)
        total = r.tokens if r.tokens is not None else n
        chunk_t += r.chunks
        chunk_k += r.per_chunk if r.per_chunk is not None else [total / max(n, 1)] * n
        offsets.append(len(chunk_t))
    return Records(
        intended=np.array([r.intended for r in reqs]),
        sent=np.array([r.intended for r in reqs]),
        done=np.array([r.done for r in reqs]),
        status=np.array([r.status for r in reqs], np.int32),
        phase=np.array([r.phase for r in reqs], np.int8),
        messages=messages or {},
        cpu_s=1.0,
        streams=Streams(
            output_tokens=np.array([r.tokens if r.tokens is not None else len(r.chunks) for r in reqs]),
            usage_known=np.array([r.tokens is not None for r in reqs]),
            chunk_known=np.array([r.per_chunk is not None for r in reqs]),
            offsets=np.array(offsets),
            chunk_t=np.array(chunk_t, np.float64),
            chunk_tokens=np.array(chunk_k, np.float64),
            timings=[{"server-timing.queue": float(i)} for i in range(len(reqs))],
        ),
    )


LEVEL = [
    Req(10.0, 10.4, [10.2, 10.25, 10.30, 10.35], tokens=4),  # TTFT 200 ms, ITL 50 ms: good
    Req(11.0, 12.6, [12.5, 12.55], tokens=2),  # TTFT 1500 ms: misses the TTFT objective
    Req(12.0, 12.5, [12.1, 12.15, 12.4], tokens=3),  # one 250 ms gap: misses the ITL objective
    Req(13.0, 13.01, status=503),  # an error
    Req(14.0, 14.1, tokens=0),  # succeeded without content: no TTFT, not good
    Req(19.9, 20.05, [19.95, 20.03], tokens=2),  # good; the last to end
    Req(9.0, 10.6, [9.5, 10.5], tokens=2, phase=WARMUP),  # load, not measured; ends inside the span
    Req(20.5, 20.7, [20.6], tokens=1, phase=COOLDOWN),  # ends after the span
]


def test_latencies_describe_the_measured_requests() -> None:
    r = summarize_llm("closed", 4, records(LEVEL), cores=2, run_s=10.0, slo=Slo(1000, 100))
    assert (r.requests, r.ok, r.empty) == (6, 5, 1)
    assert r.ttft_ms["p50"] == pytest.approx(100, rel=0.01)  # of 50, 100, 200, 1500
    assert r.ttft_ms["max"] == pytest.approx(1500, rel=0.01)
    assert r.itl_ms["max"] == pytest.approx(250, rel=0.01) and r.itl_ms["p50"] == pytest.approx(50, rel=0.01)
    assert r.tpot_ms["max"] == pytest.approx(200, rel=0.01)  # (12.5 - 12.1) / 2 tokens after the first
    assert r.e2e_ms["max"] == pytest.approx(1600, rel=0.01)
    assert r.errors == {"http 503": 1}
    assert r.output_tokens["mean"] == pytest.approx(11 / 5) and r.tokens_per_chunk == 1.0
    assert r.client_cpu_share == pytest.approx(1.0 / (10.0 * 2))
    # the server's own figures, averaged over the measured successful requests (0, 1, 2, 4, 5)
    assert r.server == {"server-timing.queue": pytest.approx(12 / 5)}


def test_rates_come_from_the_measured_span_and_goodput_from_the_objectives() -> None:
    r = summarize_llm("closed", 4, records(LEVEL), cores=2, run_s=10.0, slo=Slo(1000, 100))
    # from the first measured request's schedule (10.0) to the last one's end (20.05)
    assert r.duration_s == pytest.approx(10.05)
    # successes that ended in it: the measured five and the warmup one (its load was real)
    assert r.throughput == pytest.approx(6 / 10.05)
    # tokens that arrived in it: 4 + 2 + 3 + 2, and one of the warmup's two
    assert r.output_tokens_per_s == pytest.approx(12 / 10.05)
    # the first and the last of five measured successes met both objectives
    assert r.good_share == pytest.approx(0.4) and r.goodput == pytest.approx(0.4 * 6 / 10.05)
    # why the other three were not: a late first token, a 250 ms gap, no content at all
    assert (r.missed_ttft, r.missed_itl, r.empty) == (1, 1, 1)
    assert r.as_dict()["missed"] == {"ttft": 1, "itl": 1}
    looser = summarize_llm("closed", 4, records(LEVEL), 2, 10.0, Slo(2000, 300))
    assert looser.good_share == pytest.approx(0.8)  # all but the empty answer


def test_open_loop_goodput_is_good_arrivals_over_the_schedule_not_over_their_span() -> None:
    # three arrivals that happened to fall in 2 s of a 15 s schedule, all served well: the
    # span would make it 3 / 2.2 req/s, more than arrived; the schedule says 3 / 15
    few = [Req(t, t + 0.2, [t + 0.05, t + 0.1]) for t in (5.0, 6.0, 7.0)]
    r = summarize_llm("open", 0.2, records(few), 2, 16.0, Slo(1000, 100), offered_s=15.0)
    assert r.good_share == 1.0 and r.throughput == pytest.approx(3 / 2.2)
    assert r.goodput == pytest.approx(3 / 15)
    # only the good ones count: two of LEVEL's five measured successes over a 10 s schedule
    level = summarize_llm("open", 1, records(LEVEL), 2, 11.0, Slo(1000, 100), offered_s=10.0)
    assert level.goodput == pytest.approx(0.2)


def test_a_level_without_measured_requests_reports_no_rates() -> None:
    r = summarize_llm("closed", 1, records([Req(0.0, 1.0, [0.5], phase=WARMUP)]), 2, 1.0, Slo())
    assert r.requests == 0 and r.throughput == r.output_tokens_per_s == r.duration_s == 0
    assert r.ttft_ms == {}


def test_errors_are_named_by_kind_and_first_message() -> None:
    reqs = [Req(0.0, 1.0, [0.5], status=STREAM_CUT), Req(0.0, 1.0, status=500), Req(0.0, 1.0, status=500)]
    msgs = {STREAM_CUT: "stream cut after 1 content chunks", 500: "boom"}
    r = summarize_llm("open", 1, records(reqs, msgs), 2, 1.0, Slo())
    assert r.errors == {"stream cut: stream cut after 1 content chunks": 1, "http 500: boom": 2}
    assert r.ok == 0 and r.throughput == 0 and r.goodput == 0 and r.ttft_ms == {}


def test_itl_is_per_chunk_unless_the_server_said_per_chunk_how_many_tokens() -> None:
    times, tokens = np.array([0.0, 0.3, 0.4]), np.array([1.0, 3.0, 1.0])
    assert request_itls(times, tokens, known=False) == pytest.approx([0.3, 0.1])
    assert request_itls(times, tokens, known=True) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    # bundled chunks: ITL per chunk, TPOT per token
    reqs = [Req(0.0, 1.0, [0.1, 0.4, 0.7, 1.0], tokens=10)]
    r = summarize_llm("closed", 1, records(reqs), 2, 1.0, Slo())
    assert r.itl_ms["p50"] == pytest.approx(300, rel=0.01) and r.tpot_ms["p50"] == pytest.approx(
        100, rel=0.01
    )
    assert r.tokens_per_chunk == 2.5


def test_merged_records_keep_each_request_its_chunks() -> None:
    a = records([Req(0.0, 1.0, [0.1, 0.2]), Req(0.0, 1.0, [0.3])])
    b = records([Req(1.0, 2.0, [1.1, 1.2, 1.3])])
    m = Records.merge([a, b])
    assert len(m) == 3 and m.streams is not None
    assert list(m.streams.offsets) == [0, 2, 3, 6]
    assert list(m.streams.chunk_t[m.streams.offsets[2] : m.streams.offsets[3]]) == [1.1, 1.2, 1.3]
    assert m.cpu_s == 2.0 and len(m.streams.timings) == 3
