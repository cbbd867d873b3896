"""Hedged requests against a replica that stalls now and then, at a fixed open-loop rate.

    python benchmarks/hedging.py [--rate 60] [--seconds 20] [--rounds 3]
    python benchmarks/hedging.py --quick      # a few seconds, to check the script; writes nothing

Two replicas of the example sentiment classifier (``sentiment_model``, 1 ORT thread each),
one of them stalling 20 ms on 5% of its batches (the test-only ``test_stall_ms``
parameter), behind three pipelines that differ only in hedging:

- ``baseline``: two replicas without stalls, no hedging (``after_ms`` of a minute);
- ``no_hedge``: the stalling pair, no hedging;
- ``hedged``: the stalling pair, ``after_ms: 0`` (the step's measured p95).

Every pipeline spreads requests over its two replicas the same way (the least busy, ties
in turn), so hedging is the only difference. `milliserve bench` drives each at the same
Poisson rate over HTTP with tokenized eval tweets, the three interleaved round by round
(rotating the order); medians of the rounds. Hedges sent / won / suppressed come from the
server's /metrics. Writes the "hedging" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from report_sections import bench_level, write_section
from server_overhead import cpu_description

from milliserve.examples.build import build_examples
from milliserve.examples.sentiment import splits, tokenize
from milliserve.testing import ServerProcess

MODEL = "sentiment_model"  # the optimized full classifier (input_ids, attention_mask -> probabilities)
# model -> (the example that builds it, its output, the output's width); minilm (same inputs)
# stands in with --model minilm where the sentiment example cannot be built
MODELS = {"sentiment_model": ("sentiment", "probabilities", 2), "minilm": ("minilm", "embedding", 384)}
STALL_MS, STALL_P = 20, 0.05
CASES = 256
PIPELINE = """\
name: {name}
platform: ensemble
max_batch_size: 32
input:
  - {{name: input_ids, data_type: TYPE_INT64, dims: [-1]}}
  - {{name: attention_mask, data_type: TYPE_INT64, dims: [-1]}}
output: [{{name: {output}, data_type: TYPE_FP32, dims: [{width}]}}]
ensemble_scheduling:
  step:
    - model_name: {a}
      hedge: {{replicas: [{b}], after_ms: {after_ms}}}
"""
VARIANTS = {  # pipeline -> (replica pair, after_ms)
    "baseline": (("clean_a", "clean_b"), 60_000),
    "no_hedge": (("stall_a", "stall_b"), 60_000),
    "hedged": (("stall_a", "stall_b"), 0),
}


def build_repo(repo: Path, model: str) -> None:
    example, output, width = MODELS[model]
    staging = repo.parent / "staging"
    build_examples(staging, only=[example])
    src = staging / model
    config = (src / "config.yaml").read_text()
    for name in ("clean_a", "clean_b", "stall_a", "stall_b"):
        params = '{intra_op_thread_count: "1"'
        if name == "stall_a":
            params += f', test_stall_ms: "{STALL_MS}", test_stall_probability: "{STALL_P}"'
        text = config.replace(f"name: {model}", f"name: {name}")
        text = text.replace('parameters: {intra_op_thread_count: "2"', "parameters: " + params)
        assert text.count(f"name: {name}") == 1 and params in text, "the example's config changed"
        shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("config.*"))
        (repo / name / "config.yaml").write_text(text)
    for pipeline, ((a, b), after_ms) in VARIANTS.items():
        (repo / pipeline).mkdir()
        text = PIPELINE.format(name=pipeline, a=a, b=b, after_ms=after_ms, output=output, width=width)
        (repo / pipeline / "config.yaml").write_text(text)


def bodies(path: Path) -> Path:
    texts = [t for t, _ in splits(4000, 1000)["eval"][:CASES]]
    tokens = tokenize(texts)
    rows = []
    for i in range(len(texts)):
        n = int(tokens["attention_mask"][i].sum())  # what a client sends: its own tokens, unpadded
        ids = tokens["input_ids"][i, :n].tolist()
        rows.append(
            {
                "inputs": [
                    {"name": "input_ids", "datatype": "INT64", "shape": [1, n], "data": ids},
                    {"name": "attention_mask", "datatype": "INT64", "shape": [1, n], "data": [1] * n},
                ]
            }
        )
    path.write_text(json.dumps(rows))
    return path


def hedge_counts(server: ServerProcess, pipeline: str) -> dict[str, float]:
    counts = {"sent": 0.0, "won": 0.0, "suppressed": 0.0}
    for family in text_string_to_metric_families(httpx.get(server.metrics_url).text):
        for s in family.samples:
            for k in counts:
                if s.name == f"milliserve_pipeline_hedges_{k}_total" and s.labels.get("model") == pipeline:
                    counts[k] += s.value
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=60.0, help="requests/s, open loop (Poisson)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", choices=sorted(MODELS), default=MODEL)
    ap.add_argument("--quick", action="store_true", help="2 s levels, one round; writes no report")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.rate = 2.0, 1, min(args.rate, 30.0)
    work = Path(tempfile.mkdtemp(prefix="ms-hedging-"))
    repo = work / "repo"
    build_repo(repo, args.model)
    data = bodies(work / "bodies.json")
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    hedges: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    with ServerProcess(repo) as server:
        for rnd in range(args.rounds):
            for variant in order[rnd % len(order) :] + order[: rnd % len(order)]:
                before = hedge_counts(server, variant)
                out = work / f"{variant}-{rnd}.json"
                load = ("--data", str(data), "--rate", f"{args.rate:g}")
                lv = bench_level(server.http_url, variant, out, *load, seconds=args.seconds, warmup=2)
                after = hedge_counts(server, variant)
                results[variant].append(lv)
                hedges[variant].append({k: after[k] - before[k] for k in after})
                us = lv["latency_us"]
                print(
                    f"round {rnd} {variant}: p50 {us['p50'] / 1e3:.2f} p99 {us['p99'] / 1e3:.2f} ms, "
                    f"{lv['throughput']:.0f} req/s, hedges {hedges[variant][-1]}"
                )

    def med(variant: str, key: str) -> float:
        return float(np.median([lv["latency_us"][key] / 1e3 for lv in results[variant]]))

    def total(variant: str, key: str) -> int:
        return int(sum(h[key] for h in hedges[variant]))

    lines = [
        "## Hedged requests against a replica that stalls",
        "",
        f"`python benchmarks/hedging.py --rate {args.rate:g} --seconds {args.seconds:g} "
        f"--rounds {args.rounds} --model {args.model}`: {cpu_description()}; server and `milliserve bench` "
        f"sharing them. Two replicas of `{args.model}` (1 ORT thread each) behind a pipeline; in the "
        f"stalling pair one replica sleeps {STALL_MS} ms on {STALL_P:.0%} of its batches "
        "(`test_stall_ms`, test-only). "
        f"Open loop, Poisson at {args.rate:g} req/s, HTTP JSON bodies of {CASES} tokenized eval tweets, "
        f"{args.seconds:g} s per level after 2 s of warm-up, {args.rounds} interleaved rounds, "
        "medians; hedges summed over the rounds.",
        "",
        "| variant | p50 ms | p95 ms | p99 ms | p99.9 ms | req/s | errors | hedges sent | won | suppressed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        errors = sum(sum(lv["errors"].values()) for lv in results[v])
        rps = float(np.median([lv["throughput"] for lv in results[v]]))
        lines.append(
            f"| {v} | {med(v, 'p50'):.2f} | {med(v, 'p95'):.2f} | {med(v, 'p99'):.2f} "
            f"| {med(v, 'p99.9'):.2f} | {rps:.0f} | {errors} | {total(v, 'sent')} | {total(v, 'won')} "
            f"| {total(v, 'suppressed')} |"
        )
    requests = sum(lv["requests"] for lv in results["hedged"])
    lines += [
        "",
        f"The hedged pipeline sent a second copy for {total('hedged', 'sent') / max(requests, 1):.1%} "
        "of its requests (measured window and warm-up together against the measured requests).",
    ]
    report = "\n".join(lines)
    print(report)
    if not args.quick:
        write_section(
            "hedging",
            report,
            results={
                "settings": {"run": vars(args), "stall_ms": STALL_MS, "stall_share": STALL_P},
                "rounds": args.rounds,
                "values": {"levels": results, "hedges": hedges},  # per variant, one per round
                "summary": {v: {k: med(v, k) for k in ("p50", "p95", "p99", "p99.9")} for v in VARIANTS},
            },
        )


if __name__ == "__main__":
    main()
