"""milliserve bench against a fake OIP server whose latency we know.

The fake server (milliserve.bench.fake_server) runs in a subprocess on a free
loopback port; the load generator runs its real worker processes.
"""

from __future__ import annotations

import pytest

from milliserve.bench.fake_server import fake_server_process
from milliserve.bench.runner import BenchConfig, run_bench

fake_server = fake_server_process


def bench(url: str, **kw: object) -> dict:
    kw.setdefault("calibrate", False)
    cfg = BenchConfig(url=url, model="fake", workers=1, **kw)  # type: ignore[arg-type]
    report = run_bench(cfg)
    return report.levels[0].as_dict() | {"_level": report.levels[0]}


def test_reported_percentiles_match_a_known_distribution() -> None:
    # 1 ms, and 50 ms for every 50th request: p50 is ~1 ms and p99 ~50 ms
    with fake_server("--latency-ms", "1", "--slow-every", "50", "--slow-ms", "50") as url:
        r = bench(url, concurrency=[1], duration_s=4, warmup_s=0.5)
    p50, p99 = r["latency_us"]["p50"], r["latency_us"]["p99"]
    assert 1000 <= p50 <= 1600, p50
    assert 45_000 <= p99 <= 60_000, p99
    assert r["errors"] == {} and r["ok"] == r["requests"] > 500


def test_open_loop_exposes_a_stall_that_a_closed_loop_hides() -> None:
    # every request arriving in a 200 ms window (1.5 s - 1.7 s after start) waits for its end
    stall = ("--latency-ms", "1", "--stall-after-s", "2.0", "--stall-ms", "200")
    with fake_server(*stall) as url:
        # the fake server's clock starts at its own start; give the schedule time to reach the stall
        opened = bench(url, rates=[100.0], duration_s=3.0, warmup_s=0.5)
    with fake_server(*stall) as url:
        closed = bench(url, concurrency=[1], duration_s=3.0, warmup_s=0.5)
    open_p99, closed_p99 = opened["latency_us"]["p99"], closed["latency_us"]["p99"]
    assert open_p99 > 100_000, opened  # the stall shows, measured from each scheduled send
    assert opened["stalls"] and opened["stalls"][0]["requests"] >= 10 and opened["stalls"][0]["max_ms"] > 150
    # the closed loop sent one request into the stall and waited: its p99 barely moves
    assert closed_p99 < 20_000, closed
    # the schedule was kept: sends going out late are counted, and are rare here
    assert opened["late_sends"] <= opened["requests"] * 0.05


def test_errors_are_counted_by_status_and_message() -> None:
    with fake_server("--error-every", "10", "--error-status", "503") as url:
        r = bench(url, concurrency=[2], duration_s=2, warmup_s=0.3)
    ((key, n),) = r["errors"].items()
    assert key == 'http 503: {"error": "fake overload"}'
    assert r["ok"] + n == r["requests"]
    assert n == pytest.approx(r["requests"] / 10, abs=3)


def test_stability_mode_runs_windows_until_three_agree() -> None:
    with fake_server("--latency-ms", "1") as url:
        r = bench(url, concurrency=[1], stability_pct=50.0, window_s=0.5, warmup_s=0.2)
    assert r["stable"] and 3 <= r["windows"] <= 10
    assert 600 <= r["throughput"] <= 1000  # one request in flight, each just over 1 ms


def test_compare_runs_both_targets_and_reports_ratios() -> None:
    with fake_server("--latency-ms", "1") as fast, fake_server("--latency-ms", "3") as slow:
        cfg = BenchConfig(
            url=fast,
            model="fake",
            workers=1,
            concurrency=[1],
            duration_s=1.0,
            warmup_s=0.2,
            compare_url=slow,
            rounds=2,
            calibrate=False,
        )
        report = run_bench(cfg)
    (row,) = report.compare
    assert 2.0 <= row["b_over_a"]["p50"] <= 3.2  # ~3.1 ms against ~1.1 ms
    assert 0.3 <= row["b_over_a"]["throughput"] <= 0.5
    assert report.as_dict()["compare"]["target"] == slow
