"""``milliserve bench`` as a library: sweep load levels against a server and measure each
honestly (warmup excluded, open-loop latency from the schedule, windows until stable,
server-side split, A/B comparison), in any mode: tensors over the Open Inference Protocol,
streamed completions from an OpenAI-compatible server (``llm``), or OpenAI embeddings.

What differs between the modes (what a request is, which figures a level has) lives in
bench/modes.py; the load, the levels, the rounds and the report are the same code for all.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from milliserve.bench.cold_start import measure_cold_start
from milliserve.bench.loadgen import WorkerPool
from milliserve.bench.modes import MODES, Level, Mode, Window
from milliserve.bench.records import Records
from milliserve.bench.run_options import BenchConfig
from milliserve.bench.server_metrics import scrape, server_split
from milliserve.bench.workload import Workload
from milliserve.errors import ConfigError

__all__ = [
    "DEFAULT_WORKERS",
    "BenchConfig",
    "BenchReport",
    "Progress",
    "client_workers",
    "cpu_model",
    "machine_info",
    "run_bench",
]

Progress = Callable[[str, float], None]  # (what is running, its planned seconds; 0: unknown)

# One load-generating process unless asked for more. On a small machine the client shares
# the cores with the server it measures: at 1000 req/s on 2 vCPUs, one process per core
# (2) read p50 633-790 µs where one read 448-490 µs (docs/bench.md, "Which clock is right").
# More processes are for rates that one cannot send on time, which the late-send count reports.
DEFAULT_WORKERS = 1


def client_workers(requested: int) -> int:
    """The number of client processes to run: ``requested``, or DEFAULT_WORKERS for 0."""
    if requested < 0:
        raise ConfigError(f"--workers must be >= 0 (0 for the default of {DEFAULT_WORKERS}), got {requested}")
    return requested or DEFAULT_WORKERS


@dataclass
class BenchReport:
    config: BenchConfig
    machine: dict[str, Any]
    levels: list[Level]
    compare: list[dict[str, Any]] = field(default_factory=list)
    compare_levels: list[Level] = field(default_factory=list)
    calibration: dict[str, Any] | None = None
    cold_start: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        from milliserve._version import __version__

        c = self.config
        compare: dict[str, Any] | None = None
        if c.compare_url:
            compare = {"target": c.compare_url, "levels": self.compare}
            if c.mode == "llm":
                compare["extra_body"] = c.compare_extra_body
        doc: dict[str, Any] = {
            "tool": "milliserve bench",
            "version": __version__,
            "target": c.url,
            "model": c.model,
            "config": MODES[c.mode].config_doc(c),
            "machine": self.machine,
            "levels": [lv.as_dict() for lv in self.levels],
            "compare": compare,
            "calibration": self.calibration,
        }
        if c.mode == "tensor":
            doc["cold_start"] = self.cold_start
        return doc


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` says."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return model


def machine_info(workers: int) -> dict[str, Any]:
    """The CPU, its core count and the client's process count, for every report."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 1,
        "client_workers": workers,
        "python": platform.python_version(),
        "note": "the load generator shares the machine with the server when both run here",
    }


def _seed(cfg: BenchConfig, level: float) -> int:
    """A level's arrival schedule: the run's seed and the level (seed 0 keeps the schedules
    that earlier versions drew)."""
    return cfg.seed * 1_000_000 + int(level)


def _measure(
    pool: WorkerPool,
    cfg: BenchConfig,
    load: str,
    level: float,
    metrics_url: str | None,
    progress: Progress | None,
    label: str,
) -> Level:
    mode = MODES[cfg.mode]
    assert cfg.duration_s is not None
    before = scrape(metrics_url, cfg.model or "") if metrics_url else None
    if cfg.stability_pct is None:
        if progress:
            progress(label, 0.0 if cfg.requests else cfg.warmup_s + cfg.duration_s)
        t0 = time.monotonic()
        seed = _seed(cfg, level)
        rec = pool.run_job(load, level, cfg.duration_s, cfg.poisson, seed, cfg.warmup_s, cfg.requests)
        result = mode.summarize(cfg, load, level, rec, Window(time.monotonic() - t0, cfg.duration_s))
    else:
        result = _until_stable(pool, cfg, load, level, progress, label)
    if metrics_url:
        mode.add_server_split(result, server_split(before, scrape(metrics_url, cfg.model or "")))
    return result


def _until_stable(
    pool: WorkerPool, cfg: BenchConfig, load: str, level: float, progress: Progress | None, label: str
) -> Level:
    """perf_analyzer's method: windows until the last three agree within stability_pct
    on throughput and p99 (or max_windows is reached, reported as not stable)."""
    assert cfg.stability_pct is not None
    mode = MODES[cfg.mode]
    windows: list[tuple[Records, float]] = []
    tol = cfg.stability_pct / 100
    stable = False
    for i in range(cfg.max_windows):
        warm = cfg.warmup_s if i == 0 else 0.0
        if progress:
            progress(f"{label} window {i + 1}", warm + cfg.window_s)
        t0 = time.monotonic()
        rec = pool.run_job(load, level, cfg.window_s, cfg.poisson, _seed(cfg, level) * 100 + i, warm)
        windows.append((rec, time.monotonic() - t0))
        if len(windows) >= 3:
            last = [mode.summarize(cfg, load, level, r, Window(s, cfg.window_s)) for r, s in windows[-3:]]
            for values in (
                [mode.figure(x, "throughput") for x in last],
                [mode.figure(x, "p99") for x in last],
            ):
                mean = statistics.fmean(values)
                if mean <= 0 or any(abs(v - mean) > tol * mean for v in values):
                    break
            else:
                stable = True
                break
    tail = windows[-3:]
    # the windows' measured spans end to end: throughput over their sum
    merged = Records.merge([r for r, _ in tail])
    run_s = sum(s for _, s in tail)
    return mode.summarize(
        cfg, load, level, merged, Window(run_s, cfg.window_s * len(tail), len(windows), stable)
    )


def _workload(cfg: BenchConfig, url: str, extra_body: dict[str, Any]) -> Any:
    return MODES[cfg.mode].workload(cfg, url, extra_body)


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> BenchReport:
    """Run the sweep (and the A/B comparison when ``compare_url`` is set).

    Raises ConfigError for bad arguments, an unreachable target, an unknown model, shapes
    that do not fit it, prompts or texts that cannot be read, or (without a model) a server
    that cannot say which model it serves. Errors of the requests themselves (refused
    connections, HTTP errors, cut streams) are counted per level.
    """
    cfg.check()
    mode = MODES[cfg.mode]
    mode.check(cfg)
    workload = _workload(cfg, cfg.url, cfg.extra_body)
    cfg.model = workload.model
    workers = cfg.workers = client_workers(cfg.workers)
    pools: list[tuple[WorkerPool, str | None]] = [(WorkerPool(workload, workers), cfg.metrics_url)]
    report = BenchReport(cfg, machine_info(workers), [])
    try:
        if cfg.compare_url:
            other = _workload(cfg, cfg.compare_url, cfg.extra_body | (cfg.compare_extra_body or {}))
            pools.append((WorkerPool(other, workers), None))
        if cfg.calibrate:
            if progress:
                progress("calibrating against a zero-latency server", 2.0)
            report.calibration = mode.calibrate(workers)
        if cfg.cold_start:
            assert isinstance(workload, Workload)
            if progress:
                progress("cold start: unload, load, first requests", 5.0)
            report.cold_start = measure_cold_start(workload).as_dict()
        for load, level in cfg.levels():
            name = f"concurrency {level:g}" if load == "closed" else f"{level:g} req/s"
            if not cfg.compare_url:
                report.levels.append(_measure(pools[0][0], cfg, load, level, cfg.metrics_url, progress, name))
                continue
            runs: list[list[Level]] = [[], []]
            for r in range(cfg.rounds):  # A B A B ...: only ratios from one run mean anything
                for i, (pool, murl) in enumerate(pools):
                    label = f"{name} {'AB'[i]} round {r + 1}"
                    runs[i].append(_measure(pool, cfg, load, level, murl, progress, label))
            report.levels.append(_median(mode, runs[0]))
            report.compare_levels.append(_median(mode, runs[1]))
            report.compare.append(_ratios(mode, report.levels[-1], report.compare_levels[-1]))
    finally:
        for pool, _ in pools:
            pool.close()
    return report


def _median(mode: Mode, results: list[Level]) -> Level:
    """The round with the median of the mode's headline latency (a real measurement, not a
    blend of rounds)."""
    ordered = sorted(results, key=lambda r: mode.figure(r, mode.median_figure) or float("inf"))
    return ordered[len(ordered) // 2]


def _ratios(mode: Mode, a: Level, b: Level) -> dict[str, Any]:
    fa = {k: round(mode.figure(a, k), 3) for k in mode.compare_figures}
    fb = {k: round(mode.figure(b, k), 3) for k in mode.compare_figures}
    return {
        "level": a.level,
        "mode": a.mode,
        "a": fa,
        "b": fb,
        "b_over_a": {k: round(fb[k] / fa[k], 3) if fa[k] else None for k in mode.ratio_figures},
    }
