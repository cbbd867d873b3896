"""PNG plots of a benchmark: latency CDF (log scale), percentiles against
throughput across the sweep, and latency over time (stalls show as spikes); for
the LLM mode, TTFT and ITL CDFs and their percentiles against output tokens/s.
Needs matplotlib (the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from milliserve.bench.llm_results import LlmLevelResult
from milliserve.bench.results import LevelResult
from milliserve.bench.runner import BenchReport
from milliserve.plotting import pyplot

__all__ = ["write_plots"]


def write_plots(report: BenchReport, out_dir: Path) -> list[Path]:
    """Write the mode's plots into ``out_dir``; returns their paths."""
    if report.config.mode == "llm":
        llm = [lv for lv in report.levels if isinstance(lv, LlmLevelResult)]
        return _llm_plots(llm, str(report.config.model), out_dir)
    levels = [lv for lv in report.levels if isinstance(lv, LevelResult)]
    return _latency_plots(levels, str(report.config.model), out_dir)


def _latency_plots(levels: list[LevelResult], model: str, out_dir: Path) -> list[Path]:
    """Latency CDF, percentiles against throughput, latency over time."""
    plt = pyplot("milliserve bench --plot")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 5))
    for lv in levels:
        if lv.timeline is None or not lv.timeline[1].size:
            continue
        lat = np.sort(lv.timeline[1]) / 1e3
        ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=lv.label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Latency CDF: {model}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    paths.append(out_dir / "latency_cdf.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [lv.throughput for lv in levels]
    for key in ("p50", "p90", "p99", "p99.9"):
        ys = [lv.latency_us.get(key, np.nan) / 1e3 for lv in levels]
        ax.plot(xs, ys, marker="o", label=key)
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title("Latency percentiles against throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    paths.append(out_dir / "percentiles_vs_throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 5))
    for lv in levels:
        if lv.timeline is None or not lv.timeline[0].size:
            continue
        ax.scatter(lv.timeline[0], lv.timeline[1] / 1e3, s=2, label=lv.label, alpha=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("scheduled send time (s into the measured window)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("Latency over time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(markerscale=4)
    paths.append(out_dir / "latency_over_time.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def _llm_plots(levels: list[LlmLevelResult], model: str, out_dir: Path) -> list[Path]:
    """``ttft_cdf.png``, ``itl_cdf.png`` and ``latency_vs_tokens_per_s.png``."""
    plt = pyplot("milliserve bench --llm --plot")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, what in (("ttft_ms", "time to first token"), ("itl_ms", "inter-token latency")):
        fig, ax = plt.subplots(figsize=(8, 5))
        for lv in levels:
            values = np.sort(lv.samples.get(key, np.zeros(0)))
            values = values[values > 0]
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=lv.label)
        ax.set_xscale("log")
        ax.set_xlabel(f"{what} (ms, log scale)")
        ax.set_ylabel("fraction")
        ax.set_title(f"{what.capitalize()} CDF: {model}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        paths.append(out_dir / f"{key.removesuffix('_ms')}_cdf.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [lv.output_tokens_per_s for lv in levels]
    for name, key, stat in (
        ("TTFT p50", "ttft_ms", "p50"),
        ("TTFT p99", "ttft_ms", "p99"),
        ("ITL p50", "itl_ms", "p50"),
        ("ITL p99", "itl_ms", "p99"),
    ):
        ys = [getattr(lv, key).get(stat, np.nan) for lv in levels]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel("output tokens/s (all streams)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title("Latency against output tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    paths.append(out_dir / "latency_vs_tokens_per_s.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
