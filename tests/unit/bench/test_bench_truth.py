"""milliserve bench against a fake OIP server whose latency we know.

The fake server (milliserve.bench.fake_server) runs in a subprocess on a free
loopback port; the load generator runs its real worker processes.

What is asserted holds on any machine, however loaded: the floors the server's sleeps
set, the ceilings they set on throughput, and the modes that a right report must tell
apart. How close to the floors the tool measures on an idle machine is a performance
claim, checked by benchmarks/bench_truth.py.
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
    # the sleeps are floors; the median is the fast mode and the p99 the slow one (idle: p50
    # ~1.2 ms, p99 ~51 ms; how close to the floors: benchmarks/bench_truth.py)
    assert 1000 <= p50 < 45_000, p50
    assert p99 >= 45_000, p99
    assert r["errors"] == {} and r["ok"] == r["requests"] > 500


def test_open_loop_exposes_a_stall_that_a_closed_loop_hides() -> None:
    # every request arriving in a 200 ms window (5.0 s - 5.2 s after the fake server started)
    # waits for its end. The stall is timed from the server's start, but the measured window
    # opens once the bench has started its worker and warmed up: ~1.2 s later idle, 2-3 s on a
    # loaded machine (a stall at 2.0 s fell into the warmup there). Placed at 5.0 s, it falls
    # inside a 5 s window either way.
    stall = ("--latency-ms", "1", "--stall-after-s", "5.0", "--stall-ms", "200")
    rate, duration_s = 100.0, 5.0
    with fake_server(*stall) as url:
        # evenly spaced sends: 20 arrive in the stall, waiting 200, 190, ... 10 ms (Poisson
        # arrivals leave as few as 9 in some 200 ms windows, too few to move a p99)
        opened = bench(url, rates=[rate], duration_s=duration_s, warmup_s=0.2, poisson=False)
    with fake_server(*stall) as url:
        closed = bench(url, concurrency=[1], duration_s=duration_s, warmup_s=0.2)
    open_p99, closed_p99 = opened["latency_us"]["p99"], closed["latency_us"]["p99"]
    assert open_p99 > 100_000, opened  # the stall shows, measured from each scheduled send
    # found as one episode (a loaded machine may add short ones of its own)
    assert any(s["requests"] >= 10 and s["max_ms"] > 150 for s in opened["stalls"]), opened["stalls"]
    # the closed loop met the same stall (its slowest request waited it out) ...
    assert closed["latency_us"]["max"] > 150_000, closed
    # ... but sent only that one request into it: its p99 stays far below the stall
    assert closed_p99 < 50_000, closed
    # the open loop kept its schedule through the stall: every scheduled request went out,
    # and sends were not held back behind the stalled ones (that would make them ~200 ms late)
    assert 0.8 * rate * duration_s <= opened["requests"] <= 1.2 * rate * duration_s, opened
    assert opened["late_send_p99_ms"] < 50, opened


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
    # reported over the three windows that agreed, stitched end to end
    assert r["duration_s"] == pytest.approx(3 * 0.5, rel=0.01)
    assert r["throughput"] == pytest.approx(r["ok"] / r["duration_s"], rel=0.01)
    # one request in flight, each at least 1 ms: at most 1000/s (idle ~850/s; how near:
    # benchmarks/bench_truth.py)
    assert 0 < r["throughput"] <= 1000


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
    a, b, ratios = row["a"], row["b"], row["b_over_a"]
    # the ratios are B over A of the figures reported for each target
    assert ratios["p50"] == round(b["p50"] / a["p50"], 3)
    assert ratios["throughput"] == round(b["throughput"] / a["throughput"], 3)
    # B is the 3 ms server: its sleep (on a timer of millisecond resolution) bounds its
    # latency from below and its throughput at one request in flight from above; at the
    # median it answers the 2 ms of extra sleep later than A
    assert b["p50"] >= 2500 and b["throughput"] <= 400, row
    assert a["p50"] + 1000 <= b["p50"], row
    # B is the slower on both counts (idle ~3.1 ms against ~1.1 ms, a ratio of ~2.8 that a
    # loaded machine moves: benchmarks/bench_truth.py)
    assert ratios["p50"] > 1 and ratios["throughput"] < 1, row
    assert report.as_dict()["compare"]["target"] == slow
