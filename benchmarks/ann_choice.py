"""hnswlib against faiss-cpu for the ``ann`` step, in process, on real tweet embeddings.

    pip install 'milliserve[ann]' faiss-cpu   # faiss-cpu only for this comparison
    python benchmarks/ann_choice.py [--queries 2000] [--rounds 10] [--repeats 5]

The data: about 20k distinct tweets (the ``tweet_search`` example's), embedded by the
example MiniLM (cached under $MILLISERVE_CACHE, a few minutes on 2 cores the first
time). The queries: "typed" prefixes of random tweets (their first 30-70% of words),
embedded the same way, as the search-as-you-type example receives them.

For each library and a few settings: the build time (all cores), recall@10 against exact
inner-product search (numpy), and single-query search latency p50/p99 (one thread, the
configs interleaved round by round, so that a busy machine hurts them alike). Then the
fastest setting of each library with recall@10 >= 0.95 goes head to head, query by query;
the lower p99 there wins. Last, where the step should search: the chosen setting's time
inline against through a thread-pool hop. Writes the "ann-choice" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import faiss
import hnswlib
import numpy as np
from report_sections import write_section
from results_store import brief
from server_overhead import cpu_description

from milliserve.examples.build import build_examples
from milliserve.examples.tweet_search import tweet_embeddings, tweet_texts, typed_queries
from milliserve.percentiles import percentile, percentiles

K = 10
Search = Callable[[Any, int], Any]  # (queries [n, dim], k) -> row numbers [n, k]


@dataclass
class Config:
    library: str
    kind: str
    params: str
    build_s: float
    search: Search
    setup: Callable[[], None] = lambda: None  # before its timed rounds (thread counts)
    recall: float = 0.0
    times_us: list[float] = field(default_factory=list)
    batch32_us: float = 0.0


def exact(db: Any, queries: Any, k: int) -> Any:
    scores = queries @ db.T
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    return top


def recall(found: Any, truth: Any) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, truth, strict=True)]))


def hnsw_configs(db: Any) -> list[Config]:
    out = []
    for m, efc in ((8, 100), (16, 200), (32, 200)):
        t0 = time.perf_counter()
        index = hnswlib.Index(space="ip", dim=db.shape[1])
        index.init_index(max_elements=len(db), ef_construction=efc, M=m, random_seed=100)
        index.add_items(db, np.arange(len(db)))
        build = time.perf_counter() - t0
        for ef in (16, 32, 64, 128):

            def search(q: Any, k: int, index: Any = index, ef: int = ef) -> Any:
                return index.knn_query(q, k=k, num_threads=1)[0]

            def setup(index: Any = index, ef: int = ef) -> None:
                index.set_ef(ef)

            out.append(Config("hnswlib", "HNSW", f"M={m} efC={efc} ef={ef}", build, search, setup))
    return out


def faiss_configs(db: Any) -> list[Config]:
    out = []
    faiss.omp_set_num_threads(2)
    for m, efc in ((16, 200), (32, 200)):
        t0 = time.perf_counter()
        index = faiss.IndexHNSWFlat(db.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = efc
        index.add(db)
        build = time.perf_counter() - t0
        for ef in (16, 32, 64, 128):

            def fsearch(q: Any, k: int, index: Any = index) -> Any:
                return index.search(q, k)[1]

            def fsetup(index: Any = index, ef: int = ef) -> None:
                faiss.omp_set_num_threads(1)
                index.hnsw.efSearch = ef

            out.append(Config("faiss-cpu", "HNSWFlat", f"M={m} efC={efc} ef={ef}", build, fsearch, fsetup))
    nlist = 128
    t0 = time.perf_counter()
    quantizer = faiss.IndexFlatIP(db.shape[1])
    ivf = faiss.IndexIVFFlat(quantizer, db.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.train(db)
    ivf.add(db)
    build = time.perf_counter() - t0
    for nprobe in (8, 16, 32):

        def isetup(nprobe: int = nprobe) -> None:
            faiss.omp_set_num_threads(1)
            ivf.nprobe = nprobe

        out.append(
            Config(
                "faiss-cpu",
                "IVFFlat",
                f"nlist={nlist} nprobe={nprobe}",
                build,
                lambda q, k: ivf.search(q, k)[1],
                isetup,
            )
        )
    flat = faiss.IndexFlatIP(db.shape[1])
    flat.add(db)
    out.append(
        Config(
            "faiss-cpu",
            "FlatIP (exact)",
            "-",
            0.0,
            lambda q, k: flat.search(q, k)[1],
            lambda: faiss.omp_set_num_threads(1),
        )
    )
    out.append(Config("numpy", "exact", "matmul + argpartition", 0.0, lambda q, k: exact(db, q, k)))
    return out


def measure(configs: list[Config], queries: Any, truth: Any, rounds: int) -> None:
    for c in configs:
        c.setup()
        c.recall = recall(c.search(queries, K), truth)
    per_round = np.array_split(np.arange(len(queries)), rounds)
    clock = time.perf_counter
    for idx in per_round:
        for c in configs:
            c.setup()
            for i in idx.tolist():
                q = queries[i : i + 1]
                t0 = clock()
                c.search(q, K)
                c.times_us.append((clock() - t0) * 1e6)
    for c in configs:
        c.setup()
        batch = queries[:32]
        times = []
        for _ in range(20):
            t0 = clock()
            c.search(batch, K)
            times.append((clock() - t0) * 1e6)
        c.batch32_us = float(np.median(times))


def head_to_head(finalists: list[Config], queries: Any, repeats: int) -> dict[str, list[float]]:
    """Each query searched by every finalist in turn (the order alternating), so that a
    noisy moment of the machine hurts them alike: {library: times in µs}."""
    for c in finalists:
        c.setup()
    clock = time.perf_counter
    times: dict[str, list[float]] = {c.library: [] for c in finalists}
    for r in range(repeats):
        for i in range(len(queries)):
            q = queries[i : i + 1]
            for c in finalists if (i + r) % 2 == 0 else finalists[::-1]:
                t0 = clock()
                c.search(q, K)
                times[c.library].append((clock() - t0) * 1e6)
    return times


def inline_or_offload(c: Config, queries: Any, calls: int = 1000) -> list[tuple[int, Any, Any]]:
    """For the ann step's choice of where to search: the p50 and p99 time of a search of b
    rows on the event loop, and through the thread pool hop an offload takes (run_in_executor)."""
    c.setup()
    pool = ThreadPoolExecutor(1)
    out = []

    async def timed(rows: int) -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        clock = time.perf_counter
        inline, hop = [], []
        for i in range(calls):
            # two different queries, the order alternating: a query searched a second time
            # finds its part of the graph in cache and would flatter whichever went second
            start = (2 * i * rows) % (len(queries) - 2 * rows)
            a, b = queries[start : start + rows], queries[start + rows : start + 2 * rows]
            for way in ("inline", "hop") if i % 2 == 0 else ("hop", "inline"):
                t0 = clock()
                if way == "inline":
                    c.search(a, K)
                    inline.append(clock() - t0)
                else:
                    await loop.run_in_executor(pool, c.search, b, K)
                    hop.append(clock() - t0)
        return np.array(percentiles(inline, [50, 99])) * 1e6, np.array(percentiles(hop, [50, 99])) * 1e6

    for rows in (1, 2, 4, 8, 32):
        out.append((rows, *asyncio.run(timed(rows))))
    pool.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5, help="head-to-head passes over the queries")
    args = ap.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="ms-ann-choice-"))
    build_examples(repo, only=["minilm"])
    model = repo / "minilm" / "1" / "model.onnx"
    texts, _ = tweet_texts()
    db = np.ascontiguousarray(tweet_embeddings(model, texts))
    typed = typed_queries(texts, args.queries)
    queries = np.ascontiguousarray(tweet_embeddings(model, typed))
    truth = exact(db, queries, K)
    configs = hnsw_configs(db) + faiss_configs(db)
    measure(configs, queries, truth, args.rounds)

    def pct(c: Config, p: float) -> float:
        return percentile(c.times_us, p)

    good = [c for c in configs if c.recall >= 0.95 and c.library != "numpy" and "exact" not in c.kind]
    # the sweep's p99s rest on a few noisy samples: the fastest setting (p50) of each library
    # at recall >= 0.95 goes to a head-to-head, query by query, and the lower p99 there wins
    finalists = [
        min((c for c in good if c.library == lib), key=lambda c: pct(c, 50))
        for lib in ("hnswlib", "faiss-cpu")
    ]
    final = head_to_head(finalists, queries, args.repeats)
    winner = min(finalists, key=lambda c: percentile(final[c.library], 99))
    lines = [
        "## ANN library for the `ann` step: hnswlib against faiss-cpu",
        "",
        f"`python benchmarks/ann_choice.py`: {cpu_description()}; hnswlib {version('hnswlib')}"
        f", faiss-cpu {faiss.__version__}. {len(db):,} distinct tweets embedded by the example MiniLM "
        f"(384-d, L2-normalised), {len(queries)} queries: the first 30-70% of the words of random tweets "
        f"(typed prefixes). Recall@{K} against exact inner-product search (numpy); single-query latency "
        f"in process on one thread, {len(queries)} queries per setting in {args.rounds} rounds, the settings "
        "interleaved; builds use every core. Batch-32 is the median time of one search of 32 queries.",
        "",
        f"| library | index | parameters | build s | recall@{K} | p50 µs | p99 µs | batch-32 µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        mark = " **(chosen)**" if c is winner else " (finalist)" if c in finalists else ""
        lines.append(
            f"| {c.library} | {c.kind} | {c.params}{mark} | {c.build_s:.2f} | {c.recall:.3f} "
            f"| {pct(c, 50):.0f} | {pct(c, 99):.0f} | {c.batch32_us:.0f} |"
        )
    n = len(final[winner.library])
    p99 = {c.library: percentile(final[c.library], 99) for c in finalists}
    gap = 1 - p99[winner.library] / max(p99.values())
    lines += [
        "",
        f"Head to head: the fastest setting (p50) of each library at recall@{K} ≥ 0.95, each query searched "
        f"by both in turn (alternating which goes first), {args.repeats} passes over the queries, "
        f"{n:,} searches each:",
        "",
        "| library | setting | recall@10 | mean µs | p50 µs | p99 µs | p99.9 µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in finalists:
        t = final[c.library]
        lines.append(
            f"| {c.library} | {c.kind} {c.params} | {c.recall:.3f} | {np.mean(t):.0f} "
            f"| {percentile(t, 50):.0f} | {percentile(t, 99):.0f} | {percentile(t, 99.9):.0f} |"
        )
    lines += [
        "",
        f"Chosen: **{winner.library} {winner.kind} {winner.params}**, the lower p99 head to head "
        f"({gap:.0%} under the other). Both are HNSW over the same vectors, so close results are "
        "expected; hnswlib searches on the calling thread (no OpenMP pool to tune in a server) and "
        "lets go of the GIL, faiss-cpu installs from a wheel where hnswlib compiles (about 30 s).",
        "",
        "Where the `ann` step searches: the time of one search of b rows with the chosen setting, "
        "on the event loop and through a thread-pool hop (what an offload costs the request), "
        "1000 calls each, alternating:",
        "",
        "| rows | inline p50 µs | inline p99 µs | offloaded p50 µs | offloaded p99 µs |",
        "|---|---|---|---|---|",
    ]
    offload = inline_or_offload(winner, queries)
    for rows, inline, hop in offload:
        lines.append(f"| {rows} | {inline[0]:.0f} | {inline[1]:.0f} | {hop[0]:.0f} | {hop[1]:.0f} |")
    write_section(
        "ann-choice",
        "\n".join(lines),
        results={
            "settings": {"run": vars(args), "k": K},
            "rounds": args.rounds,
            # each setting's recall, build time and search times (count, p50, p99), and where
            # the chosen one searches: (rows, inline p50/p99 µs, offloaded p50/p99 µs)
            "values": {"settings": [brief(c) for c in configs], "inline_or_offload": offload},
            "summary": {"chosen": f"{winner.library} {winner.kind} {winner.params}"},
        },
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
