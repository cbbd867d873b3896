"""``milliserve index``: nearest-neighbour indexes for the ann pipeline step."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_index_parser"]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


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


def add_index_parser(sub: Any) -> None:
    """``index build``."""
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
