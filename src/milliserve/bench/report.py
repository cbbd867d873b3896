"""Print and save a benchmark: a rich table, JSON and CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from milliserve.bench.results import LevelResult
from milliserve.bench.runner import DEFAULT_WORKERS, BenchReport

__all__ = ["client_line", "print_report", "write_csv", "write_json"]

CSV_COLUMNS = [
    "target",
    "mode",
    "level",
    "requests",
    "ok",
    "throughput",
    "p50_us",
    "p90_us",
    "p95_us",
    "p99_us",
    "p99.9_us",
    "max_us",
    "errors",
    "late_sends",
    "client_cpu_share",
    "server_queue_us",
    "server_compute_us",
    "server_avg_batch",
]


def _row(lv: LevelResult) -> list[str]:
    lat = lv.latency_us
    srv = lv.server or {}
    errors = sum(lv.errors.values())
    return [
        lv.label,
        f"{lv.throughput:,.0f}",
        *(f"{lat[k]:,.0f}" if k in lat else "-" for k in ("p50", "p90", "p95", "p99", "p99.9", "max")),
        f"{errors}" if errors else "0",
        f"{lv.late_sends}",
        f"{lv.client_cpu_share:.0%}",
        f"{srv['queue_us']:,.0f}" if "queue_us" in srv else "-",
        f"{srv['compute_us']:,.0f}" if "compute_us" in srv else "-",
        f"{srv['avg_batch_size']:.1f}" if "avg_batch_size" in srv else "-",
    ]


def client_line(machine: dict[str, Any]) -> str:
    """Which load the client itself put on the machine: its process count, said every run
    because on a small machine each client process takes a core from the server."""
    n, cores = machine["client_workers"], machine["cores"]
    default = " (the default; --workers N for more)" if n == DEFAULT_WORKERS else ""
    return (
        f"client: {n} load-generating process{'es' if n > 1 else ''}{default} on a {cores}-core machine; "
        "when the server runs here too, they share the cores"
    )


def print_report(report: BenchReport, console: Console) -> None:
    c = report.config
    kind = "closed loop" if c.concurrency else ("Poisson" if c.poisson else "constant") + " open loop"
    title = f"{c.model} @ {c.url} ({kind})"
    table = Table(title=title)
    for col in (
        "load",
        "req/s",
        "p50 µs",
        "p90 µs",
        "p95 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "errors",
        "late",
        "client CPU",
        "srv queue µs",
        "srv compute µs",
        "avg batch",
    ):
        table.add_column(col, justify="left" if col == "load" else "right")
    for lv in report.levels:
        table.add_row(*_row(lv))
    console.print(table)
    console.print(client_line(report.machine))
    if report.calibration:
        cal = report.calibration
        console.print(
            f"calibration: against a null server the tool measures p50 {cal['null_server_p50_us']:.0f} µs, "
            f"p99 {cal['null_server_p99_us']:.0f} µs (its own overhead plus loopback)"
        )
    if report.cold_start:
        cs = report.cold_start
        console.print(
            f"cold start: ready {cs['load_s'] * 1e3:.1f} ms after the load call; first request "
            f"{cs['first_request_ms']:.2f} ms, then steady p50 {cs['steady_p50_ms']:.2f} ms / p99 "
            f"{cs['steady_p99_ms']:.2f} ms; p99 settled after {cs['requests_to_settle']} requests"
        )
    for lv in report.levels:
        for err, n in lv.errors.items():
            console.print(f"[red]{lv.label}: {n} × {err}[/red]")
        if lv.late_sends:
            console.print(
                f"[yellow]{lv.label}: {lv.late_sends} sends left more than 2 ms after their schedule "
                f"(p99 lateness {lv.late_send_p99_ms:.2f} ms); the generator could not keep up "
                f"with {c.workers} client process(es): try --workers {c.workers + 1}[/yellow]"
            )
        for st in lv.stalls:
            console.print(
                f"[red]{lv.label}: stall: {st['requests']:.0f} requests scheduled between "
                f"{st['start_s']:.2f} s and {st['end_s']:.2f} s took up to {st['max_ms']:.0f} ms[/red]"
            )
        if not lv.stable:
            console.print(f"[yellow]{lv.label}: not stable after {lv.windows} windows[/yellow]")
    if report.compare:
        cmp = Table(
            title=f"B = {c.compare_url} against A = {c.url} (medians of {c.rounds} interleaved rounds)"
        )
        for col in (
            "load",
            "A req/s",
            "B req/s",
            "A p50 µs",
            "B p50 µs",
            "A p99 µs",
            "B p99 µs",
            "B/A req/s",
            "B/A p50",
            "B/A p99",
        ):
            cmp.add_column(col, justify="left" if col == "load" else "right")
        for row in report.compare:
            a, b, r = row["a"], row["b"], row["b_over_a"]
            cmp.add_row(
                f"{row['level']:g}",
                f"{a['throughput']:,.0f}",
                f"{b['throughput']:,.0f}",
                f"{a.get('p50', 0):,.0f}",
                f"{b.get('p50', 0):,.0f}",
                f"{a.get('p99', 0):,.0f}",
                f"{b.get('p99', 0):,.0f}",
                *(f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("throughput", "p50", "p99")),
            )
        console.print(cmp)


class _Dumpable(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


def write_json(report: _Dumpable, path: Path) -> None:
    """Write ``report.as_dict()`` (a tensor or an LLM report) as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2))


def write_csv(report: BenchReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    targets = [(report.config.url, report.levels), (report.config.compare_url, report.compare_levels)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for url, levels in targets:
            for lv in levels:
                lat, srv = lv.latency_us, lv.server or {}
                w.writerow(
                    [
                        url,
                        lv.mode,
                        lv.level,
                        lv.requests,
                        lv.ok,
                        round(lv.throughput, 2),
                        *(lat.get(k, "") for k in ("p50", "p90", "p95", "p99", "p99.9", "max")),
                        sum(lv.errors.values()),
                        lv.late_sends,
                        round(lv.client_cpu_share, 3),
                        srv.get("queue_us", ""),
                        srv.get("compute_us", ""),
                        srv.get("avg_batch_size", ""),
                    ]
                )
