"""Print and save an LLM benchmark: a rich table, JSON (``report.write_json``) and CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from milliserve.bench.llm_results import LlmLevelResult
from milliserve.bench.llm_runner import LlmBenchReport
from milliserve.bench.llm_workload import ENDPOINTS
from milliserve.bench.report import client_line

__all__ = ["CSV_COLUMNS", "print_llm_report", "write_llm_csv"]

_STATS = ("p50", "p90", "p95", "p99", "max")
CSV_COLUMNS = [
    "target",
    "mode",
    "level",
    "requests",
    "ok",
    "throughput",
    "goodput",
    "output_tokens_per_s",
    *(f"{m}_{s}_ms" for m in ("ttft", "itl", "tpot", "e2e") for s in _STATS),
    "output_tokens_mean",
    "tokens_per_chunk",
    "errors",
    "late_sends",
    "client_cpu_share",
]


def _three(d: dict[str, float]) -> str:
    if not d:
        return "-"
    return " / ".join(f"{d[k]:,.0f}" if d[k] >= 100 else f"{d[k]:.1f}" for k in ("p50", "p95", "p99"))


def _row(lv: LlmLevelResult) -> list[str]:
    errors = sum(lv.errors.values())
    return [
        lv.label,
        f"{lv.throughput:.2f}",
        f"{lv.goodput:.2f}",
        f"{lv.output_tokens_per_s:,.1f}",
        f"{lv.output_tokens.get('mean', 0):.0f}",
        _three(lv.ttft_ms),
        _three(lv.itl_ms),
        _three(lv.e2e_ms),
        f"{errors}",
        f"{lv.client_cpu_share:.0%}",
    ]


def print_llm_report(report: LlmBenchReport, console: Console) -> None:
    c = report.config
    kind = "closed loop" if c.concurrency else ("Poisson" if c.poisson else "constant") + " open loop"
    table = Table(
        title=f"{c.model} @ {c.url} ({ENDPOINTS[c.endpoint]}, {kind}, max_tokens {c.max_tokens}, {c.prompts})"
    )
    for col in (
        "load",
        "req/s",
        "goodput/s",
        "out tok/s",
        "tok/req",
        "TTFT ms p50/95/99",
        "ITL ms p50/95/99",
        "e2e ms p50/95/99",
        "errors",
        "client CPU",
    ):
        table.add_column(col, justify="left" if col == "load" else "right")
    for lv in report.levels:
        table.add_row(*_row(lv))
    console.print(table)
    console.print(
        f"goodput: requests/s that met TTFT <= {c.slo_ttft_ms:g} ms and, per request, "
        f"ITL p99 <= {c.slo_itl_ms:g} ms (--slo-ttft-ms, --slo-itl-ms)"
    )
    console.print(client_line(report.machine))
    if report.calibration:
        cal = report.calibration
        console.print(
            f"calibration: against a zero-latency streaming server the tool measures TTFT p50 "
            f"{cal['null_server_ttft_p50_ms']:.2f} ms, p99 {cal['null_server_ttft_p99_ms']:.2f} ms "
            "(its own overhead plus loopback)"
        )
    for lv in report.levels:
        _notes(lv, console)
    if report.compare:
        _print_compare(report, console)


def _notes(lv: LlmLevelResult, console: Console) -> None:
    for err, n in lv.errors.items():
        console.print(f"[red]{lv.label}: {n} × {err}[/red]")
    if not lv.requests:
        console.print(f"[yellow]{lv.label}: no request was measured; raise --duration or --requests[/yellow]")
    if lv.empty:
        console.print(f"[yellow]{lv.label}: {lv.empty} answers had no content (no TTFT)[/yellow]")
    if lv.tokens_per_chunk > 1.05:
        console.print(
            f"{lv.label}: chunks carried {lv.tokens_per_chunk:.2f} tokens on average: ITL is per chunk, "
            f"TPOT per token (p50 {lv.tpot_ms.get('p50', 0):.1f} ms)"
        )
    if lv.late_sends:
        console.print(
            f"[yellow]{lv.label}: {lv.late_sends} sends left more than 2 ms after their schedule "
            f"(p99 lateness {lv.late_send_p99_ms:.2f} ms)[/yellow]"
        )
    if lv.server:
        figures = ", ".join(f"{k} {v:g}" for k, v in lv.server.items())
        console.print(f"{lv.label}: server reported (mean per request): {figures}")


def _print_compare(report: LlmBenchReport, console: Console) -> None:
    c = report.config
    b = f"{c.compare_url}" + (f" with {json.dumps(c.compare_extra_body)}" if c.compare_extra_body else "")
    cmp = Table(title=f"B = {b} against A = {c.url} (medians of {c.rounds} interleaved rounds)")
    keys = ("tok/s", "goodput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50")
    for col in ("load", *(f"B/A {k}" for k in keys)):
        cmp.add_column(col, justify="left" if col == "load" else "right")
    for row in report.compare:
        r = row["b_over_a"]
        cmp.add_row(f"{row['level']:g}", *(f"{r[k]:.2f}" if r[k] is not None else "-" for k in keys))
    console.print(cmp)


def write_llm_csv(report: LlmBenchReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    targets = [(report.config.url, report.levels), (report.config.compare_url, report.compare_levels)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for url, levels in targets:
            for lv in levels:
                w.writerow(
                    [
                        url,
                        lv.mode,
                        lv.level,
                        lv.requests,
                        lv.ok,
                        round(lv.throughput, 3),
                        round(lv.goodput, 3),
                        round(lv.output_tokens_per_s, 2),
                        *(
                            round(d[s], 3) if s in d else ""
                            for d in (lv.ttft_ms, lv.itl_ms, lv.tpot_ms, lv.e2e_ms)
                            for s in _STATS
                        ),
                        round(lv.output_tokens.get("mean", 0.0), 2),
                        round(lv.tokens_per_chunk, 3),
                        sum(lv.errors.values()),
                        lv.late_sends,
                        round(lv.client_cpu_share, 3),
                    ]
                )
