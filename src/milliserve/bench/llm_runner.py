"""``milliserve bench --llm`` as a library: sweep load levels against an
OpenAI-compatible server with streamed completions, and report TTFT, ITL,
end-to-end latency, tokens/s and goodput per level (and A/B ratios)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from milliserve._version import __version__
from milliserve.bench.calibration import calibrate_llm
from milliserve.bench.llm_loadgen import LlmRecords, run_llm_job
from milliserve.bench.llm_prompts import load_prompts
from milliserve.bench.llm_results import LlmLevelResult, Slo, summarize_llm
from milliserve.bench.llm_workload import (
    ENDPOINTS,
    LlmWorkload,
    build_llm_workload,
    default_model,
    parse_llm_target,
)
from milliserve.bench.loadgen import ProcessPool
from milliserve.bench.runner import Progress, client_workers, machine_info
from milliserve.errors import ConfigError

__all__ = ["LlmBenchConfig", "LlmBenchReport", "run_llm_bench"]

LlmPool = ProcessPool[LlmRecords]


@dataclass
class LlmBenchConfig:
    url: str
    model: str | None = None  # None: the first model GET /v1/models lists
    endpoint: str = "chat"
    prompts: str = "builtin:chat"
    max_tokens: int = 128
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    concurrency: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    poisson: bool = True
    duration_s: float = 20.0
    warmup_s: float = 1.0
    requests: int | None = None  # measure this many requests per level instead of duration_s
    slo_ttft_ms: float = 1000.0
    slo_itl_ms: float = 100.0
    timeout_s: float = 300.0
    workers: int = 0  # 0: DEFAULT_WORKERS
    compare_url: str | None = None
    # B's requests: extra_body updated with this (speculation on and off on one server, say)
    compare_extra_body: dict[str, Any] | None = None
    rounds: int = 3
    calibrate: bool = True  # measure the tool against a zero-latency streaming server first

    def check(self) -> None:
        """Raise ConfigError for arguments that cannot work, naming them."""
        if self.compare_extra_body is not None and not self.compare_url:
            self.compare_url = self.url  # the same server, with B's request options
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
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.endpoint not in ENDPOINTS:
            raise ConfigError(f"--endpoint {self.endpoint!r}: give one of {sorted(ENDPOINTS)}")
        if self.slo_ttft_ms <= 0 or self.slo_itl_ms <= 0:
            raise ConfigError("--slo-ttft-ms and --slo-itl-ms must be > 0")
        if self.timeout_s <= 0:
            raise ConfigError(f"--request-timeout must be > 0 seconds, got {self.timeout_s}")
        if self.rounds < 1:
            raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")

    def levels(self) -> list[tuple[str, float]]:
        return [("closed", float(c)) for c in self.concurrency] or [("open", float(r)) for r in self.rates]


@dataclass
class LlmBenchReport:
    config: LlmBenchConfig
    machine: dict[str, Any]
    levels: list[LlmLevelResult]
    compare: list[dict[str, Any]] = field(default_factory=list)
    compare_levels: list[LlmLevelResult] = field(default_factory=list)
    calibration: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "tool": "milliserve bench",
            "version": __version__,
            "target": c.url,
            "model": c.model,
            "config": {
                "mode": "llm " + ("closed" if c.concurrency else "open"),
                "endpoint": ENDPOINTS[c.endpoint],
                "prompts": c.prompts,
                "max_tokens": c.max_tokens,
                "temperature": c.temperature,
                "extra_body": c.extra_body,
                "arrivals": "poisson" if c.poisson else "constant",
                "duration_s": c.duration_s,
                "warmup_s": c.warmup_s,
                "requests": c.requests,
                "slo": {"ttft_ms": c.slo_ttft_ms, "itl_ms": c.slo_itl_ms, "itl_statistic": "p99 per request"},
                "workers": c.workers,
            },
            "machine": self.machine,
            "levels": [lv.as_dict() for lv in self.levels],
            "compare": (
                {"target": c.compare_url, "extra_body": c.compare_extra_body, "levels": self.compare}
                if c.compare_url
                else None
            ),
            "calibration": self.calibration,
        }


def _workload(cfg: LlmBenchConfig, url: str, extra_body: dict[str, Any]) -> LlmWorkload:
    target = parse_llm_target(url)
    return build_llm_workload(
        target,
        cfg.model or default_model(target, cfg.api_key),
        load_prompts(cfg.prompts),
        cfg.endpoint,
        cfg.max_tokens,
        cfg.temperature,
        extra_body,
        cfg.api_key,
        cfg.timeout_s,
    )


def _measure(pool: LlmPool, cfg: LlmBenchConfig, mode: str, level: float, seed: int) -> LlmLevelResult:
    t0 = time.monotonic()
    rec = pool.run_job(mode, level, cfg.duration_s, cfg.poisson, seed, cfg.warmup_s, cfg.requests)
    slo = Slo(cfg.slo_ttft_ms, cfg.slo_itl_ms)
    return summarize_llm(mode, level, rec, os.cpu_count() or 1, time.monotonic() - t0, slo)


def run_llm_bench(cfg: LlmBenchConfig, progress: Progress | None = None) -> LlmBenchReport:
    """Run the sweep (and the A/B comparison when ``compare_url`` is set).

    Raises ConfigError for bad arguments, prompts that cannot be read, or (without a
    model) a server that cannot say which model it serves. Errors of the requests
    themselves (refused connections, HTTP errors, cut streams) are counted per level.
    """
    cfg.check()
    workload = _workload(cfg, cfg.url, cfg.extra_body)
    cfg.model = workload.model
    workers = cfg.workers = client_workers(cfg.workers)
    pools: list[LlmPool] = [ProcessPool(workload, workers, run_llm_job, LlmRecords.merge)]
    report = LlmBenchReport(cfg, machine_info(workers), [])
    try:
        if cfg.compare_url:
            other = _workload(cfg, cfg.compare_url, cfg.extra_body | (cfg.compare_extra_body or {}))
            pools.append(ProcessPool(other, workers, run_llm_job, LlmRecords.merge))
        if cfg.calibrate:
            if progress:
                progress("calibrating against a zero-latency streaming server", 2.0)
            report.calibration = calibrate_llm(workers)
        planned = 0.0 if cfg.requests else cfg.warmup_s + cfg.duration_s
        for mode, level in cfg.levels():
            name = f"concurrency {level:g}" if mode == "closed" else f"{level:g} req/s"
            if not cfg.compare_url:
                if progress:
                    progress(name, planned)
                report.levels.append(_measure(pools[0], cfg, mode, level, int(level)))
                continue
            runs: list[list[LlmLevelResult]] = [[], []]
            for r in range(cfg.rounds):  # A B A B ...: only ratios from one run mean anything
                for i, pool in enumerate(pools):
                    if progress:
                        progress(f"{name} {'AB'[i]} round {r + 1}", planned)
                    runs[i].append(_measure(pool, cfg, mode, level, int(level)))
            report.levels.append(_median(runs[0]))
            report.compare_levels.append(_median(runs[1]))
            report.compare.append(_ratios(report.levels[-1], report.compare_levels[-1]))
    finally:
        for pool in pools:
            pool.close()
    return report


def _median(results: list[LlmLevelResult]) -> LlmLevelResult:
    """The round with the median end-to-end p50 (a real measurement, not a blend)."""
    ordered = sorted(results, key=lambda r: r.e2e_ms.get("p50", float("inf")))
    return ordered[len(ordered) // 2]


FIGURES: dict[str, Callable[[LlmLevelResult], float]] = {
    "req/s": lambda r: r.throughput,
    "goodput": lambda r: r.goodput,
    "tok/s": lambda r: r.output_tokens_per_s,
    "ttft_p50": lambda r: r.ttft_ms.get("p50", 0.0),
    "ttft_p99": lambda r: r.ttft_ms.get("p99", 0.0),
    "itl_p50": lambda r: r.itl_ms.get("p50", 0.0),
    "itl_p99": lambda r: r.itl_ms.get("p99", 0.0),
    "e2e_p50": lambda r: r.e2e_ms.get("p50", 0.0),
}


def _ratios(a: LlmLevelResult, b: LlmLevelResult) -> dict[str, Any]:
    fa = {k: round(float(f(a)), 3) for k, f in FIGURES.items()}
    fb = {k: round(float(f(b)), 3) for k, f in FIGURES.items()}
    return {
        "level": a.level,
        "mode": a.mode,
        "a": fa,
        "b": fb,
        "b_over_a": {k: round(fb[k] / fa[k], 3) if fa[k] else None for k in FIGURES},
    }
