"""Pure logic of the bench results: stall episodes and cold-start settling."""

from __future__ import annotations

import numpy as np

from milliserve.bench.cold_start import requests_to_settle
from milliserve.bench.results import find_stalls


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
