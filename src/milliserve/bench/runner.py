"""``milliserve bench`` as a library: sweep load levels against an OIP server and
measure each honestly (warmup excluded, open-loop latency from the schedule,
windows until stable, server-side split, A/B comparison)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from milliserve._version import __version__
from milliserve.bench.calibration import calibrate
from milliserve.bench.cold_start import measure_cold_start
from milliserve.bench.loadgen import Records, WorkerPool
from milliserve.bench.results import LevelResult, summarize
from milliserve.bench.server_metrics import scrape, server_split
from milliserve.bench.workload import Workload, build_workload, parse_target
from milliserve.errors import ConfigError

__all__ = [
    "DEFAULT_WORKERS",
    "BenchConfig",
    "BenchReport",
    "Progress",
    "client_workers",
    "machine_info",
    "run_bench",
]

Progress = Callable[[str, float], None]  # (what is running, its planned seconds)

# One load-generating process unless asked for more. On a small machine the client shares
# the cores with the server it measures: at 1000 req/s on 2 vCPUs, one process per core
# (2) read p50 633-790 µs where one read 448-490 µs and a minimal busy-wait client
# ~380 µs (docs/bench.md, "Which clock is right"). More processes are for rates that one
# cannot send on time, which the late-send count reports.
DEFAULT_WORKERS = 1


def client_workers(requested: int) -> int:
    """The number of client processes to run: ``requested``, or DEFAULT_WORKERS for 0."""
    if requested < 0:
        raise ConfigError(f"--workers must be >= 0 (0 for the default of {DEFAULT_WORKERS}), got {requested}")
    return requested or DEFAULT_WORKERS


@dataclass
class BenchConfig:
    url: str
    model: str
    version: str = ""
    concurrency: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    poisson: bool = True
    duration_s: float = 5.0
    warmup_s: float = 1.0
    stability_pct: float | None = None  # set: windows of window_s until 3 agree within this
    window_s: float = 2.0
    max_windows: int = 10
    batch: int = 1
    data: str = "random"
    zipf: float | None = None  # with data FILE.txt: a Zipf stream over its texts
    text_input: str | None = None  # with data FILE.txt: the BYTES input (default from metadata)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    binary: bool = True
    split_writes: bool = False  # HTTP: head and body in two sends, like libcurl
    workers: int = 0  # 0: DEFAULT_WORKERS (see client_workers)
    metrics_url: str | None = None
    compare_url: str | None = None
    rounds: int = 3
    calibrate: bool = True  # measure the tool against a null server first
    cold_start: bool = False  # unload + load through the repository API first

    def check(self) -> None:
        """Raise ConfigError for arguments that cannot work, naming them."""
        if not self.concurrency and not self.rates:
            self.concurrency = [1]
        if self.concurrency and self.rates:
            raise ConfigError("give --concurrency or --rate, not both")
        if any(c < 1 for c in self.concurrency):
            raise ConfigError(f"--concurrency values must be >= 1, got {self.concurrency}")
        if any(r <= 0 for r in self.rates):
            raise ConfigError(f"--rate values must be > 0 requests per second, got {self.rates}")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ConfigError("--duration must be > 0 and --warmup >= 0 seconds")

    def levels(self) -> list[tuple[str, float]]:
        return [("closed", float(c)) for c in self.concurrency] or [("open", float(r)) for r in self.rates]


@dataclass
class BenchReport:
    config: BenchConfig
    machine: dict[str, Any]
    levels: list[LevelResult]
    compare: list[dict[str, Any]] = field(default_factory=list)
    compare_levels: list[LevelResult] = field(default_factory=list)
    calibration: dict[str, Any] | None = None
    cold_start: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "tool": "milliserve bench",
            "version": __version__,
            "target": c.url,
            "model": c.model,
            "config": {
                "mode": "closed" if c.concurrency else "open",
                "arrivals": "poisson" if c.poisson else "constant",
                "duration_s": c.duration_s,
                "warmup_s": c.warmup_s,
                "stability_pct": c.stability_pct,
                "batch": c.batch,
                "data": c.data,
                "binary": c.binary,
                "split_writes": c.split_writes,
                "workers": c.workers,
            },
            "machine": self.machine,
            "levels": [lv.as_dict() for lv in self.levels],
            "compare": {"target": c.compare_url, "levels": self.compare} if c.compare_url else None,
            "calibration": self.calibration,
            "cold_start": self.cold_start,
        }


def machine_info(workers: int) -> dict[str, Any]:
    """The CPU, its core count and the client's process count, for every report."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count() or 1,
        "client_workers": workers,
        "python": platform.python_version(),
        "note": "the load generator shares the machine with the server when both run here",
    }


def _measure(
    pool: WorkerPool,
    cfg: BenchConfig,
    mode: str,
    level: float,
    metrics_url: str | None,
    progress: Progress | None,
    label: str,
) -> LevelResult:
    cores = os.cpu_count() or 1
    before = scrape(metrics_url, cfg.model) if metrics_url else None
    if cfg.stability_pct is None:
        if progress:
            progress(label, cfg.warmup_s + cfg.duration_s)
        t0 = time.monotonic()
        rec = pool.run(mode, level, cfg.warmup_s + cfg.duration_s, cfg.poisson, seed=int(level))
        start = float(rec.intended.min()) if rec.intended.size else t0
        result = summarize(
            mode,
            level,
            rec,
            start + cfg.warmup_s,
            start + cfg.warmup_s + cfg.duration_s,
            cores,
            time.monotonic() - t0,
        )
    else:
        result = _until_stable(pool, cfg, mode, level, cores, progress, label)
    after = scrape(metrics_url, cfg.model) if metrics_url else None
    result.server = server_split(before, after)
    return result


def _until_stable(
    pool: WorkerPool,
    cfg: BenchConfig,
    mode: str,
    level: float,
    cores: int,
    progress: Progress | None,
    label: str,
) -> LevelResult:
    """perf_analyzer's method: windows until the last three agree within stability_pct
    on throughput and p99 (or max_windows is reached, reported as not stable)."""
    assert cfg.stability_pct is not None
    windows: list[tuple[Records, float, float, float]] = []
    tol = cfg.stability_pct / 100
    stable = False
    for i in range(cfg.max_windows):
        warm = cfg.warmup_s if i == 0 else 0.0
        if progress:
            progress(f"{label} window {i + 1}", warm + cfg.window_s)
        t0 = time.monotonic()
        rec = pool.run(mode, level, warm + cfg.window_s, cfg.poisson, seed=int(level) * 100 + i)
        start = float(rec.intended.min()) + warm if rec.intended.size else t0
        windows.append((rec, start, start + cfg.window_s, time.monotonic() - t0))
        if len(windows) >= 3:
            last = [summarize(mode, level, r, a, b, cores, s) for r, a, b, s in windows[-3:]]
            for values in ([x.throughput for x in last], [x.latency_us.get("p99", 0.0) for x in last]):
                mean = statistics.fmean(values)
                if mean <= 0 or any(abs(v - mean) > tol * mean for v in values):
                    break
            else:
                stable = True
                break
    tail = windows[-3:]
    merged = Records.merge([r for r, *_ in tail])
    # stitch the windows' measured spans end to end: summarise each span, report over the union
    spans = [(a, b) for _, a, b, _ in tail]
    keep_from = min(a for a, _ in spans)
    keep_to = max(b for _, b in spans)
    result = summarize(
        mode,
        level,
        merged,
        keep_from,
        keep_to,
        cores,
        sum(s for *_, s in tail),
        windows=len(windows),
        stable=stable,
    )
    measured = sum(b - a for a, b in spans)
    result.throughput = result.ok / measured if measured else 0.0
    result.duration_s = measured
    return result


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> BenchReport:
    """Run the sweep (and the A/B comparison when ``compare_url`` is set).

    Raises ConfigError for bad arguments, an unreachable target, an unknown model
    or shapes that do not fit it.
    """
    cfg.check()

    def workload_for(url: str) -> Workload:
        w = build_workload(
            parse_target(url),
            cfg.model,
            cfg.version,
            cfg.batch,
            cfg.data,
            cfg.shapes,
            cfg.binary,
            zipf=cfg.zipf,
            text_input=cfg.text_input,
        )
        w.split_writes = cfg.split_writes
        return w

    workload = workload_for(cfg.url)
    workers = cfg.workers = client_workers(cfg.workers)
    pools: list[tuple[WorkerPool, str | None, Workload]] = [
        (WorkerPool(workload, workers), cfg.metrics_url, workload)
    ]
    if cfg.compare_url:
        other = workload_for(cfg.compare_url)
        pools.append((WorkerPool(other, workers), None, other))
    report = BenchReport(cfg, machine_info(workers), [])
    if cfg.calibrate:
        if progress:
            progress("calibrating against a null server", 1.3)
        report.calibration = calibrate(workers)
    if cfg.cold_start:
        if progress:
            progress("cold start: unload, load, first requests", 5.0)
        report.cold_start = measure_cold_start(workload).as_dict()
    try:
        for mode, level in cfg.levels():
            name = f"concurrency {level:g}" if mode == "closed" else f"{level:g} req/s"
            if not cfg.compare_url:
                report.levels.append(_measure(pools[0][0], cfg, mode, level, cfg.metrics_url, progress, name))
                continue
            runs: list[list[LevelResult]] = [[], []]
            for r in range(cfg.rounds):  # A B A B ...: only ratios from one run mean anything
                for i, (pool, murl, _) in enumerate(pools):
                    tag = "A" if i == 0 else "B"
                    runs[i].append(
                        _measure(pool, cfg, mode, level, murl, progress, f"{name} {tag} round {r + 1}")
                    )
            report.levels.append(_median(runs[0]))
            report.compare_levels.append(_median(runs[1]))
            report.compare.append(_ratios(report.levels[-1], report.compare_levels[-1]))
    finally:
        for pool, *_ in pools:
            pool.close()
    return report


def _median(results: list[LevelResult]) -> LevelResult:
    """The round with the median p50 (a real measurement, not a synthetic blend)."""
    ordered = sorted(results, key=lambda r: r.latency_us.get("p50", float("inf")))
    return ordered[len(ordered) // 2]


def _ratios(a: LevelResult, b: LevelResult) -> dict[str, Any]:
    def ratio(x: float, y: float) -> float | None:
        return round(y / x, 3) if x else None

    return {
        "level": a.level,
        "mode": a.mode,
        "a": {"throughput": a.throughput, **a.latency_us},
        "b": {"throughput": b.throughput, **b.latency_us},
        "b_over_a": {
            "throughput": ratio(a.throughput, b.throughput),
            "p50": ratio(a.latency_us.get("p50", 0.0), b.latency_us.get("p50", 0.0)),
            "p99": ratio(a.latency_us.get("p99", 0.0), b.latency_us.get("p99", 0.0)),
        },
    }
