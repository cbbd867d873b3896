"""Pipelines against what a client would otherwise do itself, in one server, interleaved.

    python benchmarks/pipelines.py [--seconds 4] [--rounds 5]

- ``fraud`` (user id + transaction in; features from the in-process table, the join step,
  fraud_mlp, rules) against ``fraud_mlp`` called with the 64 features the client
  assembled itself;
- ``sentiment`` (raw text in; Rust tokenizer, the shipped MiniLM + head, rules) against
  ``sentiment_model`` (the same model) called with the token ids the client computed with
  the pipeline's own tokenizer.json (the same ids the server makes).

`milliserve bench` over HTTP with JSON bodies (the same cases for both sides of a pair),
closed loop at concurrency 1, 4, 8 and 16, the targets interleaved round by round; the
capacity is the highest throughput of a level whose p99 stays within 50 ms (issue 23: a
pipeline should keep ≥ 0.9× its model's). Then each pipeline's stages from /metrics
(`milliserve budget report`). Writes the "pipelines" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from report_sections import bench_level, commit, write_section
from server_overhead import cpu_description
from tokenizers import Tokenizer

from milliserve.budget.stage_report import budget_report
from milliserve.examples.build import build_examples
from milliserve.examples.fraud import USER_FEATURES
from milliserve.examples.sentiment import splits
from milliserve.testing import ServerProcess

CASES = 64
LEVELS = (1, 4, 8, 16)
P99_BOUND_MS = 50.0


def _tensor(name: str, datatype: str, data: np.ndarray[Any, Any]) -> dict[str, Any]:
    flat = data.reshape(-1)
    values = [v.decode() for v in flat] if datatype == "BYTES" else flat.tolist()
    return {"name": name, "datatype": datatype, "shape": list(data.shape), "data": values}


def bodies(repo: Path, work: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    with (repo / "fraud" / "users.csv").open() as f:
        table = {r["user_id"]: [float(r[n]) for n in USER_FEATURES] for r in csv.DictReader(f)}
    users = [f"u{i:04d}" for i in rng.integers(0, len(table), CASES)]
    tx = (rng.normal(size=(CASES, 4)) * 1.5).astype(np.float32)
    texts = [t for t, _ in splits(200, 200)["eval"][:CASES]]
    tok = Tokenizer.from_file(str(repo / "sentiment" / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(64)  # the pipeline's max_length (examples/sentiment_pipeline.py)
    out: dict[str, list[dict[str, Any]]] = {
        "fraud": [],
        "fraud_mlp": [],
        "sentiment": [],
        "sentiment_model": [],
    }
    for i in range(CASES):
        uid = np.array([[users[i].encode()]], dtype=object)
        out["fraud"].append(
            {"inputs": [_tensor("user_id", "BYTES", uid), _tensor("transaction", "FP32", tx[i : i + 1])]}
        )
        joined = np.concatenate([tx[i], np.asarray(table[users[i]], np.float32)])[None]
        out["fraud_mlp"].append({"inputs": [_tensor("features", "FP32", joined)]})
        out["sentiment"].append(
            {"inputs": [_tensor("TEXT", "BYTES", np.array([[texts[i].encode()]], dtype=object))]}
        )
        enc = tok.encode(texts[i])  # what a client sends: its own tokens, unpadded
        ids = np.asarray([enc.ids], np.int64)
        out["sentiment_model"].append(
            {
                "inputs": [
                    _tensor("input_ids", "INT64", ids),
                    _tensor("attention_mask", "INT64", np.ones_like(ids)),
                ]
            }
        )
    paths = {}
    for name, rows in out.items():
        paths[name] = work / f"{name}.json"
        paths[name].write_text(json.dumps(rows))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ms-pipelines-"))
    repo = work / "repo"
    build_examples(repo)
    data = bodies(repo, work)
    pairs = [("fraud", "fraud_mlp"), ("sentiment", "sentiment_model")]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with ServerProcess(repo) as server:
        for rnd in range(args.rounds):
            for conc in LEVELS:
                for pipeline, model in pairs:
                    for target in (pipeline, model):  # A B A B
                        out = work / f"{target}-{conc}-{rnd}.json"
                        lv = bench_level(
                            server.http_url,
                            target,
                            out,
                            "--data",
                            str(data[target]),
                            "--concurrency",
                            str(conc),
                            seconds=args.seconds,
                        )
                        results.setdefault((target, conc), []).append(lv)
                        print(target, conc, rnd, f"{lv['throughput']:.0f} req/s")
        stages = {p: budget_report(server.http_url, p, server.metrics_url) for p, _ in pairs}
        runs = {}  # requests per run of each pipeline's steps (pipeline/batching.py)
        for p, _ in pairs:
            st = httpx.get(f"http://{server.http_url}/v2/models/{p}/stats").json()["model_stats"][0]
            runs[p] = st["inference_stats"]["success"]["count"] / max(st["execution_count"], 1)

    def spread(target: str, conc: int) -> str:
        vals = [lv["throughput"] for lv in results[(target, conc)]]
        return f"{np.median(vals):.0f} ({min(vals):.0f}–{max(vals):.0f})"

    def med(target: str, conc: int, key: str) -> float:
        vals = [
            lv["throughput"] if key == "rps" else lv["latency_us"][key] / 1e3
            for lv in results[(target, conc)]
        ]
        return float(np.median(vals))

    measured_at = commit()
    lines = [
        "## Pipelines against the client doing the steps itself",
        "",
        f"`python benchmarks/pipelines.py` at commit {measured_at}: {cpu_description()}; server and "
        "`milliserve bench` sharing "
        f"them; HTTP JSON bodies ({CASES} cases per target, the same cases on both sides of a pair), "
        f"closed loop, {args.seconds:g} s per level after 1 s of warm-up, "
        f"{args.rounds} interleaved rounds, medians. fraud_mlp runs on 1 ORT thread, MiniLM on 2.",
        "",
        "| pipeline | vs (client does the rest) | concurrency | pipeline req/s (min–max) | "
        "model req/s (min–max) | "
        "pipeline p50 ms | model p50 ms | pipeline p99 ms | model p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def capacity(target: str) -> float:
        ok = [med(target, c, "rps") for c in LEVELS if med(target, c, "p99") <= P99_BOUND_MS]
        return max(ok, default=0.0)

    for pipeline, model in pairs:
        for conc in LEVELS:
            lines.append(
                f"| {pipeline} | {model} | {conc} | {spread(pipeline, conc)} "
                f"| {spread(model, conc)} "
                f"| {med(pipeline, conc, 'p50'):.2f} | {med(model, conc, 'p50'):.2f} "
                f"| {med(pipeline, conc, 'p99'):.2f} | {med(model, conc, 'p99'):.2f} |"
            )
    lines += [
        "",
        f"Capacity (the best level with p99 ≤ {P99_BOUND_MS:g} ms) and p50 at one connection, the "
        "pipeline against its model (issue 23's targets: ≥ 0.9× the capacity, p50 within +0.1 ms):",
        "",
        "| pipeline | model | pipeline capacity req/s | model capacity req/s | ratio | p50 at c=1, "
        "pipeline minus model ms |",
        "|---|---|---|---|---|---|",
    ]
    for pipeline, model in pairs:
        cp, cm = capacity(pipeline), capacity(model)
        ratio = cp / cm if cm else float("nan")
        lines.append(
            f"| {pipeline} | {model} | {cp:.0f} | {cm:.0f} | {ratio:.2f}× | "
            f"{med(pipeline, 1, 'p50') - med(model, 1, 'p50'):+.2f} |"
        )
    lines += [
        "",
        "Requests per run of the pipeline's steps over the whole run (concurrent requests share "
        "runs; the sentiment pipeline's texts are padded to the longest of their run, where the "
        "model fed token ids merges only requests of one length): "
        + ", ".join(f"{p} {r:.2f}" for p, r in runs.items())
        + ".",
    ]
    lines += [
        "",
        "Where each pipeline's time goes, over every request of the run (stage histograms from /metrics, "
        "so the percentiles are bucket estimates):",
        "",
        "| pipeline | stage | p50 ms | p99 ms | budget ms |",
        "|---|---|---|---|---|",
    ]
    for pipeline, report in stages.items():
        for row in report.rows:
            budget = "-" if row.budget_ms is None else f"{row.budget_ms:g}"
            lines.append(f"| {pipeline} | {row.stage} | {row.p50_ms:.3f} | {row.p99_ms:.3f} | {budget} |")
    write_section(
        "pipelines",
        "\n".join(lines),
        results={
            "settings": {"run": vars(args)},
            "rounds": args.rounds,
            "values": results,  # (target, concurrency) -> its `milliserve bench` level per round
            "summary": {"requests_per_run": runs, "stages": stages},
        },
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
