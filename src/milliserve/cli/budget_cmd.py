"""``milliserve budget``: each stage's latency against a model's budget, from /metrics."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_budget_parser"]


def _budget_report(args: argparse.Namespace) -> int:
    from rich.table import Table

    from milliserve.budget.stage_report import budget_report, plot_waterfall
    from milliserve.cli.console import table_console
    from milliserve.plotting import pyplot

    if args.plot:
        pyplot("milliserve budget report --plot")  # before any work: fail now if it cannot draw
    report = budget_report(args.url, args.model, args.metrics_url)
    console = table_console()
    table = Table(title=f"{report.model}: per-stage latency against the budget (from histogram buckets)")
    for col in ("stage", "requests", "p50 ms", "p95 ms", "p99 ms", "budget ms", "slack ms", ""):
        table.add_column(col, justify="left" if col in ("stage", "") else "right")
    for r in report.rows:
        table.add_row(
            r.stage,
            f"{r.count:,}",
            f"{r.p50_ms:.3f}",
            f"{r.p95_ms:.3f}",
            f"{r.p99_ms:.3f}",
            "-" if r.budget_ms is None else f"{r.budget_ms:g}",
            "-" if r.slack_ms is None else f"{r.slack_ms:+.3f}",
            "[red]OVER[/red]" if r.over else "",
        )
    console.print(table)
    total = f"sum of stage p99s {report.p99_sum_ms:.3f} ms"
    if report.p99_budget_ms:
        total += f" against a p99 budget of {report.p99_budget_ms:g} ms"
    console.print(total + (f"; over budget: {', '.join(report.over_budget)}" if report.over_budget else ""))
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2))
    if args.plot:
        console.print(f"waterfall: {plot_waterfall(report, args.plot / f'budget-{report.model}.png')}")
    return 3 if report.over_budget and args.fail_over else 0


def add_budget_parser(sub: Any) -> None:
    """``budget report``."""
    bg = sub.add_parser("budget", help="latency budgets")
    bsub = bg.add_subparsers(dest="budget_command", required=True)
    br = bsub.add_parser("report", help="each stage's p50/p95/p99 against the model's budget, from /metrics")
    br.add_argument("url", help="the server, http://host:port (its model config holds the budget)")
    br.add_argument("-m", "--model", required=True)
    br.add_argument(
        "--metrics-url",
        default=None,
        help="Prometheus endpoint (default: the server's /metrics, else port 8002)",
    )
    br.add_argument("--json", type=Path, default=None, help="write the report as JSON")
    br.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write the waterfall PNG into DIR")
    br.add_argument("--fail-over", action="store_true", help="exit 3 when a stage is over its budget")
    br.set_defaults(func=_budget_report)
