"""The LLM mode's load against the fake OpenAI server (milliserve.bench.fake_openai, a
subprocess on a free port): which requests are measured, that they all ran under the
full load, and that the sweep and the A/B comparison report what they measured.

The fake server is no model; it stands in for one to test the client and its loops."""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest

from milliserve.bench.fake_openai import fake_openai_process
from milliserve.bench.llm_prompts import load_prompts
from milliserve.bench.llm_workload import build_llm_workload
from milliserve.bench.loadgen import Job, arrivals, run_job
from milliserve.bench.openai_target import parse_api_target
from milliserve.bench.records import COOLDOWN, MEASURED, WARMUP, Records
from milliserve.bench.runner import BenchConfig, _seed, run_bench


def job_records(url: str, mode: str, level: float, **kw: object) -> Records:
    """One job in this process (no worker process), starting now."""
    w = build_llm_workload(parse_api_target(url), "fake-llm", load_prompts("builtin:chat"), max_tokens=8)
    job = Job(mode, level, time.monotonic() + 0.05, **kw)  # type: ignore[arg-type]
    return asyncio.run(run_job(w, job))


def others_busy(rec: Records, i: int) -> float:
    """How many other requests were in flight during request i, on average over its time."""
    overlap = np.minimum(rec.done, rec.done[i]) - np.maximum(rec.sent, rec.sent[i])
    overlap[i] = 0.0
    return float(np.clip(overlap, 0.0, None).sum() / (rec.done[i] - rec.sent[i]))


def test_a_counted_level_measures_exactly_n_and_keeps_the_load_until_they_end() -> None:
    with fake_openai_process("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "8") as url:
        rec = job_records(url, "closed", 3, duration_s=1.0, warmup_s=0.1, requests=7)
    measured = rec.phase == MEASURED
    assert measured.sum() == 7 and (rec.status == 200).all()
    warmup = rec.phase == WARMUP
    assert warmup.any() and rec.intended[warmup].max() < rec.intended[measured].min()
    # 7 over 3 connections: the seventh would have run alone; the cooldown's requests kept
    # the other two connections busy while every measured request ran
    assert (rec.phase == COOLDOWN).any()
    for i in np.flatnonzero(measured):
        assert others_busy(rec, i) >= 1.8, (i, others_busy(rec, i))  # 2 while all three are busy


def test_an_open_loop_sends_on_schedule_and_measures_from_it() -> None:
    with fake_openai_process("--ttft-ms", "20", "--tokens", "4") as url:
        rec = job_records(url, "open", 20.0, duration_s=1.0, warmup_s=0.2, requests=5, poisson=False)
    m = rec.phase == MEASURED
    assert m.sum() == 5 and (rec.status == 200).all()
    assert np.diff(np.sort(rec.intended)) == pytest.approx(0.05)  # constant arrivals at 20/s
    assert rec.streams is not None
    first = rec.streams.chunk_t[rec.streams.offsets[:-1]]
    assert (first - rec.intended >= 0.020).all()  # TTFT runs from the schedule, past the server's 20 ms


def test_a_timed_level_measures_what_was_scheduled_in_its_window() -> None:
    with fake_openai_process("--ttft-ms", "10", "--tokens", "4") as url:
        rec = job_records(url, "closed", 1, duration_s=0.5, warmup_s=0.1)
    m = rec.phase == MEASURED
    # the first warmup request went out as the job started, give or take the moment it took
    # to leave on a loaded machine (seen: 0.75 ms): the window's edges are known to that
    start, lag = rec.intended.min(), 0.02
    assert m.sum() >= 2
    assert ((rec.intended[m] >= start + 0.1 - lag) & (rec.intended[m] < start + 0.1 + 0.5)).all()
    assert (rec.intended[~m] < start + 0.1).any()  # the warmup


def test_the_sweep_reports_floors_it_cannot_beat_and_every_request() -> None:
    with fake_openai_process(
        "--ttft-ms", "30", "--itl-ms", "5", "--tokens", "8", "--continuous-usage"
    ) as url:
        cfg = BenchConfig(mode="llm", url=url, concurrency=[1, 2], requests=4, warmup_s=0.1, calibrate=False)
        report = run_bench(cfg)
    assert cfg.model == "fake-llm" and cfg.workers == 1  # asked of /v1/models; one client process
    for lv in report.levels:
        assert lv.requests == lv.ok == 4 and lv.errors == {}
        # the fake server's sleeps are floors; an event-loop timer may fire a fraction of a
        # millisecond early (uvloop rounds timers to milliseconds), hence 0.9 x, not an exact 30
        assert lv.ttft_ms["p50"] >= 0.9 * 30 and lv.tpot_ms["p50"] >= 0.9 * 5
        assert lv.output_tokens["mean"] == 8 and lv.good_share == 1.0
        assert lv.throughput > 0 and lv.output_tokens_per_s > 0
    doc = report.as_dict()
    assert doc["config"]["mode"] == "llm closed" and doc["config"]["endpoint"] == "/v1/chat/completions"
    assert [lv["level"] for lv in doc["levels"]] == [1, 2]


def test_compare_runs_both_targets_in_turn_and_reports_ratios() -> None:
    with (
        fake_openai_process("--ttft-ms", "10", "--tokens", "4") as fast,
        fake_openai_process("--ttft-ms", "60", "--tokens", "4") as slow,
    ):
        cfg = BenchConfig(
            mode="llm",
            url=fast,
            compare_url=slow,
            concurrency=[1],
            requests=3,
            warmup_s=0.1,
            rounds=2,
            calibrate=False,
        )
        report = run_bench(cfg)
    (row,) = report.compare
    a, b, ratio = row["a"], row["b"], row["b_over_a"]
    assert ratio["ttft_p50"] == round(b["ttft_p50"] / a["ttft_p50"], 3)
    assert b["ttft_p50"] >= 60 and a["ttft_p50"] >= 10 and b["ttft_p50"] > a["ttft_p50"]
    assert report.compare_levels[0].ttft_ms["p50"] == pytest.approx(b["ttft_p50"], abs=1e-3)
    assert report.as_dict()["compare"]["target"] == slow


def test_errors_are_counted_and_the_run_goes_on() -> None:
    with fake_openai_process("--tokens", "6", "--error-every", "3", "--cut-every", "5") as url:
        cfg = BenchConfig(
            mode="llm", url=url, model="any", concurrency=[2], requests=15, warmup_s=0.0, calibrate=False
        )
        (lv,) = run_bench(cfg).levels
    assert lv.requests == 15 and 0 < lv.ok < 15
    assert sum(lv.errors.values()) == lv.requests - lv.ok
    assert {k.split(":")[0] for k in lv.errors} == {"http 500", "stream cut"}


def test_compare_extra_body_runs_b_on_the_same_server_with_its_options() -> None:
    with fake_openai_process("--tokens", "4") as url:
        cfg = BenchConfig(
            mode="llm",
            url=url,
            compare_extra_body={"max_tokens": 2},  # the fake honours max_tokens: B's answers are shorter
            concurrency=[1],
            requests=2,
            warmup_s=0.0,
            rounds=1,
            calibrate=False,
        )
        report = run_bench(cfg)
    assert cfg.compare_url == url
    assert report.levels[0].output_tokens["mean"] == 4 and report.compare_levels[0].output_tokens["mean"] == 2
    assert report.as_dict()["compare"]["extra_body"] == {"max_tokens": 2}


def test_an_open_loops_schedule_is_drawn_from_its_seed() -> None:
    def schedule(seed: int, rate: float = 0.72) -> list[float]:
        cfg = BenchConfig("http://127.0.0.1:1", mode="llm", rates=[rate], seed=seed)
        return list(itertools.islice(arrivals(Job("open", rate, 0.0, 30.0, seed=_seed(cfg, rate))), 30))

    # rounds that take their own seeds sample different arrivals; a seed replays its own
    assert schedule(1) == schedule(1) and schedule(1) != schedule(2)
    assert np.mean(np.diff(schedule(3))) == pytest.approx(1 / 0.72, rel=0.5)
    # seed 0 (the default) draws the schedules that runs without --seed drew before
    assert _seed(BenchConfig("http://127.0.0.1:1", rates=[0.72]), 0.72) == 0
