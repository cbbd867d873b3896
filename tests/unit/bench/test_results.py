"""Pure logic of the bench results: late sends, stall episodes and cold-start settling."""

from __future__ import annotations

import numpy as np

from milliserve.bench.cold_start import requests_to_settle
from milliserve.bench.records import MEASURED, Records
from milliserve.bench.results import LATE_SEND_S, find_stalls, summarize


def test_late_sends_are_counted_and_latency_runs_from_the_schedule() -> None:
    intended = np.arange(100) * 0.01  # 100 requests a second for 1 s
    sent = intended + LATE_SEND_S / 20
    sent[[10, 20, 30]] += 2.5 * LATE_SEND_S  # three went out 5 ms after their instant
    rec = Records(intended, sent, sent + 0.001, np.full(100, 200, np.int32), np.full(100, MEASURED, np.int8))
    r = summarize("open", 100.0, rec, 1.0, cores=2, run_s=1.0)
    assert r.requests == r.ok == 100 and r.late_sends == 3
    assert r.late_send_p99_ms > 2.5 * LATE_SEND_S * 1e3
    assert r.latency_us["max"] >= 6000  # a late send's wait counts: 5 ms late + 1 ms answer


def test_stalls_are_grouped_into_episodes() -> None:
    offsets = np.arange(0, 3, 0.01)
    latency = np.full(offsets.size, 1000.0)
    latency[150:170] = np.linspace(200_000, 10_000, 20)  # 200 ms draining to 10 ms
    latency[250] = 50_000  # a single slow request is not a stall
    (episode,) = find_stalls(offsets, latency, p50_us=1000.0)
    assert episode["requests"] == 19 and 1.49 < episode["start_s"] < 1.51 and episode["max_ms"] == 200


def test_requests_to_settle_finds_the_end_of_the_cold_phase() -> None:
    lat = np.full(400, 1.0)
    lat[:30] = np.linspace(20, 2, 30)  # a slow start
    assert 30 <= requests_to_settle(lat) <= 80
    assert requests_to_settle(np.full(400, 1.0)) == 0
