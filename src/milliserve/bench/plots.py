"""PNG plots of a benchmark: latency CDF (log scale), percentiles against
throughput across the sweep, and latency over time (stalls show as spikes).
Needs matplotlib (the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from milliserve.bench.runner import BenchReport
from milliserve.plotting import pyplot

__all__ = ["write_plots"]


def write_plots(report: BenchReport, out_dir: Path) -> list[Path]:
    """Write the three plots into ``out_dir``; returns their paths."""
    plt = pyplot("milliserve bench --plot")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 5))
    for lv in report.levels:
        if lv.timeline is None or not lv.timeline[1].size:
            continue
        lat = np.sort(lv.timeline[1]) / 1e3
        ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=lv.label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Latency CDF: {report.config.model}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    paths.append(out_dir / "latency_cdf.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [lv.throughput for lv in report.levels]
    for key in ("p50", "p90", "p99", "p99.9"):
        ys = [lv.latency_us.get(key, np.nan) / 1e3 for lv in report.levels]
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
    for lv in report.levels:
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
