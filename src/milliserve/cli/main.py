"""The ``milliserve`` command. Each subcommand is a module of this package that adds its
parser and calls a library function (``add_<name>_parser``); heavy imports happen inside the
command so ``--help`` is instant.

Exit codes: 0 success, 1 error, 2 usage.
"""

from __future__ import annotations

import argparse
import sys

from milliserve._version import __version__
from milliserve.cli.bench_cmd import add_bench_parser
from milliserve.cli.budget_cmd import add_budget_parser
from milliserve.cli.demo_cmd import add_demo_parser
from milliserve.cli.edge_cmd import add_edge_parser
from milliserve.cli.examples_cmd import add_examples_parser
from milliserve.cli.features_cmd import add_features_parser
from milliserve.cli.index_cmd import add_index_parser
from milliserve.cli.optimize_cmd import add_optimize_parser
from milliserve.cli.ray_cmd import add_ray_parser
from milliserve.cli.serve import UsageError, add_serve_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="milliserve", description="Real-time ML inference server.")
    parser.add_argument("--version", action="version", version=f"milliserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        add_serve_parser,
        add_examples_parser,
        add_bench_parser,
        add_edge_parser,
        add_ray_parser,
        add_optimize_parser,
        add_features_parser,
        add_index_parser,
        add_budget_parser,
        add_demo_parser,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:
        parser.exit(2, f"milliserve {args.command}: error: {exc}\n")
    except Exception as exc:  # one line for the user, not a traceback
        from milliserve.errors import MilliserveError

        kind = "error" if isinstance(exc, MilliserveError) else type(exc).__name__
        print(f"milliserve: {kind}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
