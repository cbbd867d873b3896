"""``milliserve examples``: write the example model repository, Triton's example repository,
or the sentiment tutorial's data."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_EXAMPLE_REPO", "add_examples_parser"]

DEFAULT_EXAMPLE_REPO = Path("build/model_repository")


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


def add_examples_parser(sub: Any) -> None:
    """``examples build``, ``examples triton``, ``examples data``."""
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
