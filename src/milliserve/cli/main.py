"""The ``milliserve`` command. Each subcommand parses its arguments and calls a
library function; heavy imports happen inside the command so ``--help`` is instant.

Exit codes: 0 success, 1 error, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from milliserve._version import __version__

__all__ = ["main"]

DEFAULT_EXAMPLE_REPO = Path("build/model_repository")


def _serve(args: argparse.Namespace) -> int:
    from milliserve.config.settings import Settings
    from milliserve.observability.logs import configure_logging
    from milliserve.server.app import serve

    overrides: dict[str, object] = {
        "model_repository": args.model_repository,
        "model_control_mode": args.model_control_mode,
    }
    if args.host is not None:
        overrides["host"] = args.host
    if args.load_model:
        overrides["load_models"] = args.load_model
    if args.log_level:
        overrides["log_level"] = args.log_level
    settings = Settings(**overrides)  # type: ignore[arg-type]
    for section, port in (("http", args.http_port), ("grpc", args.grpc_port), ("metrics", args.metrics_port)):
        if port is not None:
            getattr(settings, section).port = port
    if args.max_request_bytes is not None:
        settings.http.max_request_bytes = args.max_request_bytes
        settings.grpc.max_message_bytes = args.max_request_bytes
    configure_logging(settings.log_level)
    serve(settings)
    return 0


def _examples_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from milliserve.examples.build import build_examples

    console = Console(stderr=True)
    with console.status("building examples") as status:
        results = build_examples(args.dir, args.only, lambda n: status.update(f"building {n} ..."))
    for name, result in results.items():
        console.print(f"[green]built[/green] {name}: {result}")
    console.print(f"serve it with: milliserve serve {args.dir}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from milliserve.examples.demo import run_demo

    console = Console()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="milliserve", description="Real-time ML inference server.")
    parser.add_argument("--version", action="version", version=f"milliserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    s.add_argument("model_repository", type=Path, metavar="MODEL_REPOSITORY")
    s.add_argument("--http-port", type=int, default=None, help="default 8000")
    s.add_argument("--grpc-port", type=int, default=None, help="default 8001")
    s.add_argument("--metrics-port", type=int, default=None, help="default 8002")
    s.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument(
        "--model-control-mode",
        choices=("none", "explicit"),
        default="none",
        help="explicit enables the repository load/unload API (default none)",
    )
    s.add_argument(
        "--load-model",
        action="append",
        metavar="NAME",
        help="in explicit mode, load NAME at start ('*' for all); repeatable",
    )
    s.add_argument("--max-request-bytes", type=int, default=None, help="request body limit (default 32 MiB)")
    s.add_argument("--log-level", default=None)
    s.set_defaults(func=_serve)

    e = sub.add_parser("examples", help="example model repository")
    esub = e.add_subparsers(dest="examples_command", required=True)
    eb = esub.add_parser("build", help="write the example repository (no downloads)")
    eb.add_argument("dir", type=Path, nargs="?", default=DEFAULT_EXAMPLE_REPO)
    eb.add_argument("--only", action="append", metavar="NAME", help="fraud_mlp or minilm; repeatable")
    eb.set_defaults(func=_examples_build)

    d = sub.add_parser("demo", help="build the examples, serve them, call them with tritonclient")
    d.add_argument("--dir", type=Path, default=DEFAULT_EXAMPLE_REPO)
    d.add_argument("--requests", type=int, default=300)
    d.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line for the user, not a traceback
        from milliserve.errors import MilliserveError

        kind = "error" if isinstance(exc, MilliserveError) else type(exc).__name__
        print(f"milliserve: {kind}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
