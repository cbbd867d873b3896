"""The ``milliserve`` command. Each subcommand parses its arguments and calls a
library function; heavy imports happen inside the command so ``--help`` is instant.

Exit codes: 0 success, 1 error, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from milliserve._version import __version__
from milliserve.cli.bench import add_bench_parser
from milliserve.cli.edge import add_edge_parser
from milliserve.cli.ray_cmd import add_ray_parser
from milliserve.cli.serve import UsageError, parse_bool, serve_settings

__all__ = ["main"]

DEFAULT_EXAMPLE_REPO = Path("build/model_repository")


def _serve(args: argparse.Namespace) -> int:
    from milliserve.observability.logs import configure_logging
    from milliserve.server.app import serve

    settings = serve_settings(args)
    configure_logging(settings.log_level)
    return serve(settings)


def _examples_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from milliserve.examples.build import build_examples

    console = Console(stderr=True)
    with console.status("building examples") as status:
        results = build_examples(args.dir, args.only, lambda n: status.update(f"building {n} ..."))
    for name, result in results.items():
        console.print(f"[green]built[/green] {name}: {result}")
    if not args.only:
        from milliserve.examples.build import OPTIONAL

        for name, check in OPTIONAL.items():
            reason = check()
            if reason:
                console.print(f"[yellow]skipped[/yellow] {name}: {reason}")
    console.print(f"serve it with: milliserve serve {args.dir}")
    return 0


def _examples_triton(args: argparse.Namespace) -> int:
    from milliserve.examples.triton import build_triton_examples

    for path in build_triton_examples(args.dir, args.only):
        print(f"built {path.name}: {path}")
    print(f"serve it with: milliserve serve {args.dir} --shared-memory system")
    return 0


def _examples_data(args: argparse.Namespace) -> int:
    from rich.console import Console

    from milliserve.examples.tutorial_data import write_tutorial_data

    console = Console(stderr=True)
    with console.status("writing the sentiment tutorial's data (the FP32 classifier: a minute, once)"):
        paths = write_tutorial_data(args.dir, args.eval, args.zipf)
    for name, path in paths.items():
        console.print(f"[green]wrote[/green] {name}: {path}")
    return 0


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


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive sizes like 1,8,32")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _features_load(args: argparse.Namespace) -> int:
    from milliserve.features.store import write_table_to_redis

    n = write_table_to_redis(args.table, args.key, args.redis, args.prefix)
    print(f"wrote {n} entities from {args.table} to {args.redis} as hashes {args.prefix}<{args.key}>")
    return 0


def _index_build(args: argparse.Namespace) -> int:
    from milliserve.optimize.progress import RichProgress
    from milliserve.pipeline.ann_index import HnswParams
    from milliserve.pipeline.text_index import build_text_index, find_encoder, read_texts

    params = HnswParams(m=args.m, ef_construction=args.ef_construction, ef=args.ef)
    progress = RichProgress()
    texts = read_texts(args.texts, args.column, args.limit)
    progress.stage(
        f"{len(texts.texts):,} texts from {args.texts} ({texts.skipped_empty} empty and "
        f"{texts.skipped_duplicates} duplicates skipped)"
    )
    encoder = find_encoder(args.repo, args.model, args.tokenizer, args.embedding)
    with progress.steps(f"embedding with {args.model}", len(texts.texts)) as advance:
        index = build_text_index(texts, encoder, args.output, params, args.model, advance, args.metric)
    progress.console.print(
        f"[green]wrote[/green] {args.output} (+ .json, .npz): {index.count:,} vectors of dim {index.dim}; "
        f"use it in a pipeline step: ann: {{index: {args.output.name}, input: embedding, k: 10}}"
    )
    return 0


def _budget_report(args: argparse.Namespace) -> int:
    from rich.table import Table

    from milliserve.budget.report import budget_report, plot_waterfall
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


def _optimize(args: argparse.Namespace) -> int:
    from milliserve.optimize.api import optimize
    from milliserve.optimize.progress import RichProgress
    from milliserve.optimize.torch_variants import TrainConfig

    progress = RichProgress()
    console = progress.console
    report = optimize(
        args.source,
        args.eval,
        args.output,
        args.calibration,
        args.tolerance,
        args.metric,
        args.latency,
        args.threads,
        only=args.variant,
        progress=progress,
        train_path=args.train,
        prune_amount=args.prune,
        student=args.student,
        student_layers=args.student_layers,
        train_config=TrainConfig(
            epochs=args.epochs, lr=args.lr, temperature=args.temperature, alpha=args.alpha
        ),
        batches=tuple(args.batches),
        rounds=args.rounds,
        budget_s=args.budget_s,
        finalists=args.finalists,
        final_rounds=args.final_rounds,
        ship=args.ship,
    )
    print((args.output / "report.md").read_text())
    if report.winner is None:
        console.print(
            f"[red]no variant kept {args.metric} within {args.tolerance} of FP32; nothing shipped[/red]"
        )
        return 1
    console.print(f"{report.why}")
    console.print(
        f"shipped {report.winner} to {args.output}; serve it with: milliserve serve {args.output.parent}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="milliserve", description="Real-time ML inference server.")
    parser.add_argument("--version", action="version", version=f"milliserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    s.add_argument(
        "model_repository",
        type=Path,
        nargs="?",
        default=None,
        metavar="MODEL_REPOSITORY",
        help="the model repository (default: $MILLISERVE_MODEL_REPOSITORY)",
    )
    s.add_argument("--http-port", type=int, default=None, help="default 8000")
    s.add_argument("--grpc-port", type=int, default=None, help="default 8001")
    s.add_argument("--metrics-port", type=int, default=None, help="default 8002")
    s.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        default=None,
        help="none: load every model at start (default); poll: and follow the repository's "
        "changes; explicit: the repository load/unload API decides (as Triton)",
    )
    s.add_argument(
        "--repository-poll-secs",
        type=float,
        default=None,
        metavar="S",
        help="in poll mode, how often the repository is read for changes (default 15)",
    )
    s.add_argument(
        "--shared-memory",
        choices=("off", "system"),
        default=None,
        help="system: Triton's system shared-memory extension for clients on this machine (default off)",
    )
    s.add_argument(
        "--shared-memory-key-prefix",
        default=None,
        metavar="PREFIX",
        help="shared-memory keys clients may register must start with PREFIX, e.g. /myapp_ (default: any)",
    )
    s.add_argument(
        "--load-model",
        action="append",
        metavar="NAME",
        help="in explicit mode, load NAME at start ('*' for all); repeatable",
    )
    s.add_argument("--max-request-bytes", type=int, default=None, help="request body limit (default 32 MiB)")
    s.add_argument("--log-level", default=None)
    s.add_argument(
        "--redis-url",
        default=None,
        help="Redis for response caches with backend redis (default redis://127.0.0.1:6379/0)",
    )
    s.add_argument(
        "--auth-token",
        default=None,
        help="require this token (Authorization: Bearer, or x-api-key) on inference, metadata and "
        "repository calls; health and metrics stay open (env MILLISERVE_AUTH__TOKEN)",
    )
    s.add_argument(
        "--strict-readiness",
        type=parse_bool,
        default=None,
        metavar="true|false",
        help="ready only while every model that should serve does (default true, as Triton)",
    )
    s.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="N processes sharing the ports, each with its own models (default 1; docs/deploy.md)",
    )
    s.add_argument(
        "--edge",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve the browser bundles in DIR (milliserve edge build) at /edge/<model>/ (default off)",
    )
    s.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="export OpenTelemetry traces per stage over OTLP/HTTP to URL (a collector's base URL, "
        "as OTEL_EXPORTER_OTLP_ENDPOINT; default off)",
    )
    s.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=None,
        metavar="R",
        help="with --otlp-endpoint: the share of requests traced that bring no traceparent "
        "(default 0.01; a caller's sampled flag is always followed; OTEL_TRACES_SAMPLER replaces it)",
    )
    s.set_defaults(func=_serve)

    e = sub.add_parser("examples", help="example model repository")
    esub = e.add_subparsers(dest="examples_command", required=True)
    eb = esub.add_parser("build", help="write the example repository (no downloads)")
    eb.add_argument("dir", type=Path, nargs="?", default=DEFAULT_EXAMPLE_REPO)
    eb.add_argument(
        "--only", action="append", metavar="NAME", help="fraud_mlp, minilm, sentiment, ...; repeatable"
    )
    eb.set_defaults(func=_examples_build)
    et = esub.add_parser(
        "triton",
        help="ONNX models with the names, tensors and configs of Triton's example repository "
        "(simple, simple_sequence, ...), for Triton's own example clients",
    )
    et.add_argument("dir", type=Path, nargs="?", default=Path("build/triton_repository"))
    et.add_argument("--only", action="append", metavar="NAME", help="simple, simple_sequence...; repeatable")
    et.set_defaults(func=_examples_triton)
    ed = esub.add_parser("data", help="the sentiment tutorial's data: tweets, token streams, the FP32 model")
    ed.add_argument("dir", type=Path)
    ed.add_argument("--eval", type=int, default=1000, help="held-out tweets (default 1000)")
    ed.add_argument("--zipf", type=float, default=1.1, help="the token stream's Zipf exponent (default 1.1)")
    ed.set_defaults(func=_examples_data)

    add_bench_parser(sub)
    add_edge_parser(sub)
    add_ray_parser(sub)

    o = sub.add_parser("optimize", help="build, measure and ship the fastest variant of a model")
    o.add_argument(
        "source",
        help="an .onnx model, a TorchScript file, or package.module:factory returning (nn.Module, example)",
    )
    o.add_argument("--eval", type=Path, required=True, help=".npz of inputs (and 'labels' for accuracy)")
    o.add_argument("--calibration", type=Path, default=None, help=".npz of inputs for static INT8")
    o.add_argument(
        "--tolerance", type=float, default=0.01, help="allowed quality drop from FP32 (default 0.01)"
    )
    o.add_argument(
        "--metric",
        default="accuracy",
        help="accuracy (needs labels), cosine (to FP32), embedding (cosine and recall@10 "
        "to FP32's vectors), or module:function",
    )
    o.add_argument(
        "--train", type=Path, default=None, help=".npz of inputs and labels for fine-tuning and distillation"
    )
    o.add_argument("--prune", type=float, default=0.5, help="pruning amount, 0..1 (default 0.5)")
    o.add_argument("--student", default=None, help="module:factory returning the student nn.Module")
    o.add_argument(
        "--student-layers", type=int, default=None, help="keep this many teacher layers (default a third)"
    )
    o.add_argument("--epochs", type=int, default=2, help="fine-tuning and distillation epochs (default 2)")
    o.add_argument("--lr", type=float, default=1e-4, help="fine-tuning and distillation learning rate")
    o.add_argument("--temperature", type=float, default=2.0, help="distillation temperature (default 2)")
    o.add_argument(
        "--alpha", type=float, default=0.5, help="weight of the teacher's soft targets (default 0.5)"
    )
    o.add_argument("--batches", default="1,8,32", type=_ints, help="batch sizes to time (default 1,8,32)")
    o.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    o.add_argument(
        "--latency",
        default="p50_b1_us",
        help="what 'fastest' means (default p50_b1_us; a p99 needs 1000 calls per variant, see --rounds)",
    )
    o.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="time bound of each accuracy-aware INT8 search (default 300)",
    )
    o.add_argument(
        "--finalists", type=int, default=3, help="variants re-timed head to head with FP32 (default 3)"
    )
    o.add_argument(
        "--final-rounds",
        type=int,
        default=15,
        help="interleaved rounds of the head-to-head re-timing (default 15)",
    )
    o.add_argument(
        "--ship", default=None, help="ship this variant instead (built, servable, within tolerance)"
    )
    o.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads while measuring (default 1)")
    o.add_argument("--variant", action="append", help="build only these variants (repeatable)")
    o.add_argument("--output", type=Path, required=True, help="REPO/NAME to write the winner into")
    o.set_defaults(func=_optimize)

    fe = sub.add_parser("features", help="online feature store")
    fsub = fe.add_subparsers(dest="features_command", required=True)
    fl = fsub.add_parser("load", help="materialise a feature table (CSV or Parquet) into Redis hashes")
    fl.add_argument("table", type=Path)
    fl.add_argument("--redis", required=True, help="redis://host:port/db")
    fl.add_argument("--key", default="id", help="the entity id column (default id)")
    fl.add_argument("--prefix", default="", help="hash key prefix, e.g. user: (default none)")
    fl.set_defaults(func=_features_load)

    ix = sub.add_parser("index", help="nearest-neighbour indexes for the ann pipeline step")
    isub = ix.add_subparsers(dest="index_command", required=True)
    ib = isub.add_parser("build", help="embed texts with a repository's encoder and build an ANN index")
    ib.add_argument("texts", type=Path, help="a text file, one text per line (or a CSV with --column)")
    ib.add_argument("--repo", type=Path, required=True, help="the model repository holding the encoder")
    ib.add_argument("--model", required=True, help="the encoder model (ONNX: input_ids, attention_mask)")
    ib.add_argument("--output", type=Path, required=True, help="the index file (and PATH.json, PATH.npz)")
    ib.add_argument("--column", default=None, help="read this column of a CSV file")
    ib.add_argument(
        "--tokenizer", type=Path, default=None, help="tokenizer.json (default: the one the repository uses)"
    )
    ib.add_argument("--embedding", default=None, help="the encoder output to index (default: its first)")
    ib.add_argument("--metric", choices=("ip", "cosine"), default="ip", help="default ip (unit vectors)")
    ib.add_argument("--m", type=_positive, default=16, help="HNSW links per node (default 16)")
    ib.add_argument("--ef-construction", type=_positive, default=200, help="HNSW build breadth (default 200)")
    ib.add_argument("--ef", type=_positive, default=64, help="HNSW search breadth (default 64)")
    ib.add_argument("--limit", type=_positive, default=None, help="index at most this many texts")
    ib.set_defaults(func=_index_build)

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
    except UsageError as exc:
        parser.exit(2, f"milliserve {args.command}: error: {exc}\n")
    except Exception as exc:  # one line for the user, not a traceback
        from milliserve.errors import MilliserveError

        kind = "error" if isinstance(exc, MilliserveError) else type(exc).__name__
        print(f"milliserve: {kind}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
