"""``milliserve edge build REPO/MODEL --out DIR``: a browser bundle for one model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_edge_parser"]


def _edge_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from milliserve.edge.bundle import build_bundle

    console = Console(stderr=True)
    with console.status(f"building the browser bundle for {args.model.name} (npm, once per version)"):
        bundle = build_bundle(
            args.model,
            args.out,
            version=args.version,
            model_file=args.model_file,
            budget_ms=args.budget_ms,
            threads=args.threads,
            bundle_name=args.name,
            webgpu=args.webgpu,
            provider=args.provider,
            fp16=args.fp16,
        )
    m = bundle.manifest["model"]
    console.print(
        f"[green]wrote[/green] {bundle.path} ({bundle.total_bytes / 2**20:.1f} MiB in all)\n"
        f"  model: {m['source']}, {m['precision']}, {m['bytes'] / 2**20:.1f} MiB: {m['why']}\n"
        f"  tokenizer: {'yes' if bundle.manifest['tokenizer'] else 'none (tensor inputs)'}; "
        f"edge budget {bundle.manifest['edge']['budget_ms']:g} ms, else the server's "
        f"{bundle.manifest['server']['infer_path']}"
    )
    gpu = bundle.manifest["edge"]["webgpu"]
    if gpu is not None:
        mib = gpu["runtime_bytes"] / 2**20
        line = (
            f"  WebGPU: the {gpu['flavour']} runtime ({mib:.1f} MiB, fetched only by pages that get "
            f"an adapter); pages use {bundle.manifest['edge']['provider']}"
        )
        half = gpu["half_model"]
        if half is not None:
            diff = half["max_abs_diff"]
            line += f"; FP16 copy {half['bytes'] / 2**20:.1f} MiB, max |diff| {diff:.1e} on a sample"
        console.print(line)
    for note in bundle.notes:
        console.print(f"[yellow]note[/yellow] {note}")
    repo = args.model.parent
    console.print(
        f"serve it: milliserve serve {repo} --edge {args.out}\n"
        f"then open http://127.0.0.1:8000/edge/{bundle.path.name}/ (8000: the server's --http-port)"
    )
    return 0


def add_edge_parser(sub: Any) -> None:
    e = sub.add_parser("edge", help="run a model in the browser (onnxruntime-web), the server as fallback")
    esub = e.add_subparsers(dest="edge_command", required=True)
    b = esub.add_parser(
        "build",
        help="write a static bundle (model, tokenizer, JS client, demo page) for REPO/MODEL",
    )
    b.add_argument("model", type=Path, metavar="REPO/MODEL", help="a model or a pipeline of a repository")
    b.add_argument(
        "--out", type=Path, default=Path("edge"), help="bundles go to OUT/<MODEL>/ (default ./edge)"
    )
    b.add_argument("--version", type=int, default=None, help="model version (default: the latest)")
    b.add_argument("--model-file", type=Path, default=None, help="ship this .onnx instead of the served one")
    b.add_argument(
        "--budget-ms",
        type=float,
        default=None,
        help="answer in the page only when warm-up p90 is within this (default: the model's budget "
        "p99_ms, else 50)",
    )
    b.add_argument("--name", default=None, help="the bundle's name under OUT and /edge/ (default: MODEL)")
    b.add_argument("--threads", type=int, default=0, help="WASM threads (default 0: ORT's choice)")
    b.add_argument(
        "--webgpu",
        nargs="?",
        const="jspi",
        default=None,
        choices=("jspi", "asyncify"),
        help="ship onnxruntime-web's WebGPU runtime too, loaded only by pages that get an adapter: "
        "jspi (default, 16.8 MB, Chrome/Edge 137+) or asyncify (26.8 MB, any WebGPU browser)",
    )
    b.add_argument(
        "--provider",
        default="auto",
        choices=("auto", "wasm", "webgpu"),
        help="the pages' provider: auto (default: the faster of WASM and WebGPU by the warm-up), "
        "or only wasm or webgpu (pages may override it)",
    )
    b.add_argument(
        "--fp16",
        action="store_true",
        help="with --webgpu: add an FP16 copy of an FP32 model, used on adapters with shader-f16 "
        "when it is faster",
    )
    b.set_defaults(func=_edge_build)
