"""The tweet_search pipeline served: recall of the answers and the ann step's latency.

    python benchmarks/ann_search.py [--queries 3000]
    python benchmarks/ann_search.py --quick     # 300 queries, prints, writes nothing

Builds the example repository's ``minilm`` and ``tweet_search`` (about 20k tweets; the
embeddings are cached under $MILLISERVE_CACHE), serves it (`milliserve serve`, a
subprocess), and sends "typed" queries (the first 30-70% of the words of random tweets)
one at a time over HTTP with keep-alive. Reports recall@10 of the served neighbours
against exact inner-product search (numpy, over the same embeddings the index holds),
the ann stage's p50/p99 from the Server-Timing header, the other stages, and the
end-to-end latency the client saw. Writes the "ann-search" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from report_sections import write_section
from server_overhead import cpu_description

from milliserve.examples.build import build_examples
from milliserve.examples.tweet_search import tweet_embeddings, tweet_texts, typed_queries
from milliserve.percentiles import percentile
from milliserve.testing import ServerProcess

K = 10
WARMUP = 50


def server_timing(header: str) -> dict[str, float]:
    """``parse;dur=0.021, ann;dur=0.060, ...`` as {stage: ms}."""
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="300 queries; print, write nothing")
    args = ap.parse_args()
    n = 300 if args.quick else args.queries
    repo = Path(tempfile.mkdtemp(prefix="ms-ann-search-")) / "repo"
    build_examples(repo, only=["tweet_search"])
    model = repo / "minilm" / "1" / "model.onnx"
    texts, rows = tweet_texts()
    db = tweet_embeddings(model, texts)
    queries = typed_queries(texts, n + WARMUP, seed=1)
    q = tweet_embeddings(model, queries)
    exact = rows[np.argsort(-(q @ db.T), axis=1, kind="stable")[:, :K]]
    meta = json.loads((repo / "tweet_search" / "tweets.index.json").read_text())
    hnsw = ", ".join(f"{k}={v}" for k, v in meta["params"].items() if k != "seed")

    found: list[list[int]] = []
    stages: dict[str, list[float]] = {}
    client_ms: list[float] = []
    with ServerProcess(repo) as server, httpx.Client(timeout=30) as http:
        url = f"http://{server.http_url}/v2/models/tweet_search/infer"
        for i, text in enumerate(queries):
            body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}
            t0 = time.perf_counter()
            r = http.post(url, json=body)
            elapsed = (time.perf_counter() - t0) * 1e3
            r.raise_for_status()
            if i < WARMUP:
                continue
            client_ms.append(elapsed)
            for stage, ms in server_timing(r.headers["server-timing"]).items():
                stages.setdefault(stage, []).append(ms)
            ids = next(o for o in r.json()["outputs"] if o["name"] == "ids")
            found.append(ids["data"])
    truth = exact[WARMUP:]
    recall = float(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, truth.tolist(), strict=True)]))

    def pct(values: list[float], p: float) -> float:
        return percentile(values, p)

    ann = stages["ann"]
    lines = [
        "## Search as you type: the `tweet_search` pipeline served",
        "",
        f"`python benchmarks/ann_search.py --queries {n}`: {cpu_description()}; server and client "
        f"sharing them. {len(texts):,} tweets in an HNSW index (hnswlib {meta['library_version']}, {hnsw}), "
        f"{n} typed queries (the first 30-70% of the words of random tweets) sent one at a time over "
        f"HTTP/JSON after {WARMUP} of warm-up; the pipeline tokenizes, embeds with MiniLM (FP32 ONNX, 2 "
        "threads) and searches. Recall against exact inner-product search over the same embeddings; "
        "stage times from the Server-Timing header.",
        "",
        f"- **recall@{K}: {recall:.3f}** (target ≥ 0.95)",
        f"- **ann step: p50 {pct(ann, 50) * 1e3:.0f} µs, p99 {pct(ann, 99) * 1e3:.0f} µs**, "
        f"p99.9 {pct(ann, 99.9) * 1e3:.0f} µs (target p99 < 1 ms)",
        f"- end to end at the client: p50 {pct(client_ms, 50):.2f} ms, p99 {pct(client_ms, 99):.2f} ms",
        "",
        "| stage | p50 ms | p99 ms |",
        "|---|---|---|",
    ]
    for stage, values in stages.items():
        lines.append(f"| {stage} | {pct(values, 50):.3f} | {pct(values, 99):.3f} |")
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        write_section(
            "ann-search",
            text,
            results={
                "settings": {"queries": n, "warmup": WARMUP, "k": K, "index": meta},
                "values": {"client_ms": client_ms, "stages_ms": stages},
                "summary": {
                    f"recall@{K}": recall,
                    "ann_ms": {p: pct(ann, p) for p in (50, 99, 99.9)},
                    "client_ms": {p: pct(client_ms, p) for p in (50, 99)},
                },
            },
        )


if __name__ == "__main__":
    main()
