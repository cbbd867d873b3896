"""Print and save a benchmark of any mode: a rich table, JSON and CSV. The columns are the
mode's (bench/modes.py); the frame, the notes every mode shares and the A/B table are here."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from milliserve.bench.modes import MODES
from milliserve.bench.runner import DEFAULT_WORKERS, BenchReport

__all__ = ["client_line", "print_report", "write_csv", "write_json"]

CSV_PREFIX = ["target", "mode", "level", "requests", "ok", "throughput"]


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
    mode = MODES[c.mode]
    kind = "closed loop" if c.concurrency else ("Poisson" if c.poisson else "constant") + " open loop"
    table = Table(title=mode.title(c, kind))
    columns = mode.columns()
    table.add_column("load", justify="left")
    for title, _ in columns:
        table.add_column(title, justify="right")
    for lv in report.levels:
        table.add_row(lv.label, *(cell(lv) for _, cell in columns))
    console.print(table)
    for line in mode.footer(c):
        console.print(line)
    console.print(client_line(report.machine))
    if report.calibration:
        console.print(mode.calibration_line(report.calibration))
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
        for line in mode.notes(lv):
            console.print(line)
    if report.compare:
        _print_compare(report, console)


def _print_compare(report: BenchReport, console: Console) -> None:
    c = report.config
    mode = MODES[c.mode]
    b = c.compare_url or ""
    if c.compare_extra_body:
        b += f" with {json.dumps(c.compare_extra_body)}"
    table = Table(title=f"B = {b} against A = {c.url} (medians of {c.rounds} interleaved rounds)")
    table.add_column("load", justify="left")
    keys = mode.ratio_figures
    names = {"throughput": "req/s"}
    if mode.compare_values:
        for k in keys:
            table.add_column(f"A {names.get(k, k)}", justify="right")
            table.add_column(f"B {names.get(k, k)}", justify="right")
    for k in keys:
        table.add_column(f"B/A {names.get(k, k)}", justify="right")
    for row in report.compare:
        a, bb, r = row["a"], row["b"], row["b_over_a"]
        values = [f"{x[k]:,.0f}" for k in keys for x in (a, bb)] if mode.compare_values else []
        table.add_row(
            f"{row['level']:g}", *values, *(f"{r[k]:.2f}" if r[k] is not None else "-" for k in keys)
        )
    console.print(table)


def write_json(report: BenchReport, path: Path) -> None:
    """Write ``report.as_dict()`` as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2))


def write_csv(report: BenchReport, path: Path) -> None:
    """One row per level and target: the mode's figures after the columns all modes share."""
    mode = MODES[report.config.mode]
    path.parent.mkdir(parents=True, exist_ok=True)
    targets = [(report.config.url, report.levels), (report.config.compare_url, report.compare_levels)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*CSV_PREFIX, *mode.csv_columns])
        for url, levels in targets:
            for lv in levels:
                shared = [url, lv.mode, lv.level, lv.requests, lv.ok, round(lv.throughput, 3)]
                w.writerow([*shared, *mode.csv_row(lv)])
