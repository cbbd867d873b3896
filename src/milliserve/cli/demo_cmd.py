"""``milliserve demo``: build the examples, serve them, and call them with tritonclient."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from milliserve.cli.examples_cmd import DEFAULT_EXAMPLE_REPO

__all__ = ["add_demo_parser"]


def _demo(args: argparse.Namespace) -> int:
    from rich.table import Table

    from milliserve.cli.console import table_console
    from milliserve.examples.demo import run_demo

    console = table_console()
    summaries = run_demo(args.dir, args.requests, log=console.print)
    table = Table(title="milliserve demo: latency seen by tritonclient (sequential requests)")
    for col in ("path", "requests", "p50 ms", "p95 ms", "p99 ms", "req/s"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for s in summaries:
        table.add_row(
            s.name,
            str(s.requests),
            f"{s.p50_ms:.3f}",
            f"{s.p95_ms:.3f}",
            f"{s.p99_ms:.3f}",
            f"{s.throughput:.0f}",
        )
    console.print(table)
    return 0


def add_demo_parser(sub: Any) -> None:
    """``demo``."""
    d = sub.add_parser("demo", help="build the examples, serve them, call them with tritonclient")
    d.add_argument("--dir", type=Path, default=DEFAULT_EXAMPLE_REPO)
    d.add_argument("--requests", type=int, default=300)
    d.set_defaults(func=_demo)
