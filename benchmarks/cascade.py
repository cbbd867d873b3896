"""The confidence cascade against its two models alone: accuracy, escalation and latency.

    python benchmarks/cascade.py [--rate 40] [--seconds 20] [--rounds 3]
    python benchmarks/cascade.py --quick      # a few seconds, to check the script; writes nothing

The example sentiment pipeline (raw text → Rust tokenizer → model → rules) served four
ways from one server: ``sentiment_fast`` alone (the shallow INT8 student), ``sentiment_model``
alone (the optimized full classifier), and the cascade (``sentiment_fast`` answers the rows
whose top probability clears the threshold, ``sentiment_model`` the rest) at a few thresholds.

- **Accuracy** on the held-out eval tweets (``milliserve.examples.sentiment.splits``, the
  split the example's heads were not trained on), sent in batches of 32; the escalation
  rate is the share of rows whose ``answered_by`` names the full model.
- **Latency**: `milliserve bench` at one Poisson rate over HTTP, one tweet per request,
  the pipelines interleaved round by round (rotating the order); medians of the rounds.
  The pipelines keep the example's budget (p99 50 ms): refusals (429) are errors.

Writes the "cascade" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from report_sections import bench_level, write_section
from server_overhead import cpu_description

from milliserve.examples.build import build_examples
from milliserve.examples.sentiment import LABELS, splits
from milliserve.testing import ServerProcess

FAST, FULL = "sentiment_fast", "sentiment_model"
THRESHOLDS = (0.7, 0.8, 0.9)
BATCH = 32
ROOMY = {"x-request-deadline-ms": "600000"}  # the accuracy pass is not about the budget


def build_repo(repo: Path) -> list[str]:
    """The models and one pipeline per variant; returns the pipelines' names."""
    staging = repo.parent / "staging"
    build_examples(staging, only=["sentiment"])
    for name in (FAST, FULL):
        shutil.copytree(staging / name, repo / name)
    plain = (staging / "sentiment" / "config.yaml").read_text()
    cascade = (staging / "sentiment_cascade" / "config.yaml").read_text()
    step = f"- model_name: {FULL}"
    assert step in plain and "escalate_below: 0.8" in cascade, "the example's pipelines changed"
    texts = {
        "fast_only": plain.replace(step, f"- model_name: {FAST}"),
        "full_only": plain,
        **{
            f"cascade_{int(t * 100)}": cascade.replace("escalate_below: 0.8", f"escalate_below: {t:g}")
            for t in THRESHOLDS
        },
    }
    for name, text in texts.items():
        shutil.copytree(staging / "sentiment", repo / name, ignore=shutil.ignore_patterns("config.*"))
        text = re.sub(r"^name: \S+$", f"name: {name}", text, count=1, flags=re.M)
        (repo / name / "config.yaml").write_text(text)
    return list(texts)


def _text_body(texts: list[str]) -> dict[str, Any]:
    return {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]}


def accuracy(url: str, pipeline: str, rows: list[tuple[str, int]]) -> tuple[float, float]:
    """(accuracy, share of rows the full model answered) over ``rows``."""
    right = escalated = 0
    with httpx.Client(timeout=600) as c:
        for i in range(0, len(rows), BATCH):
            chunk = rows[i : i + BATCH]
            r = c.post(
                f"{url}/v2/models/{pipeline}/infer", json=_text_body([t for t, _ in chunk]), headers=ROOMY
            )
            r.raise_for_status()
            out = {o["name"]: o["data"] for o in r.json()["outputs"]}
            right += sum(label == LABELS[y] for label, (_, y) in zip(out["label"], chunk, strict=True))
            by = out.get("answered_by", [FAST if pipeline == "fast_only" else FULL] * len(chunk))
            escalated += sum(b == FULL for b in by)
    return right / len(rows), escalated / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s, open loop (Poisson)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--eval", type=int, default=1000, help="eval tweets for the accuracy pass")
    ap.add_argument(
        "--quick", action="store_true", help="2 s levels, one round, 128 tweets; writes no report"
    )
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.eval, args.rate = 2.0, 1, 128, min(args.rate, 20.0)
    work = Path(tempfile.mkdtemp(prefix="ms-cascade-"))
    repo = work / "repo"
    pipelines = build_repo(repo)
    rows = splits(4000, 1000)["eval"][: args.eval]
    data = work / "bodies.json"
    data.write_text(json.dumps([_text_body([t]) for t, _ in rows[:256]]))
    quality: dict[str, tuple[float, float]] = {}
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in pipelines}
    with ServerProcess(repo) as server:
        url = f"http://{server.http_url}"
        for p in pipelines:
            quality[p] = accuracy(url, p, rows)
            print(f"{p}: accuracy {quality[p][0]:.3f}, escalated {quality[p][1]:.1%}")
        for rnd in range(args.rounds):
            for p in pipelines[rnd % len(pipelines) :] + pipelines[: rnd % len(pipelines)]:
                out = work / f"{p}-{rnd}.json"
                load = ("--data", str(data), "--rate", f"{args.rate:g}")
                lv = bench_level(server.http_url, p, out, *load, seconds=args.seconds, warmup=2)
                results[p].append(lv)
                us = lv["latency_us"]
                print(f"round {rnd} {p}: p50 {us['p50'] / 1e3:.2f} p99 {us['p99'] / 1e3:.2f} ms")

    def med(p: str, key: str) -> float:
        return float(np.median([lv["latency_us"][key] / 1e3 for lv in results[p]]))

    lines = [
        "## Confidence cascade: the fast model, the full model, and both",
        "",
        f"`python benchmarks/cascade.py --rate {args.rate:g} --seconds {args.seconds:g} "
        f"--rounds {args.rounds}`: "
        f"{cpu_description()}; server and `milliserve bench` sharing them. The example sentiment pipeline "
        f"(tokenizer → model → rules) with `{FAST}` alone, `{FULL}` alone, and a cascade at each threshold. "
        f"Accuracy and escalation on {len(rows)} held-out eval tweets (batches of {BATCH}); latency at "
        f"{args.rate:g} req/s Poisson, one tweet per request, {args.seconds:g} s per level after 2 s of "
        f"warm-up, {args.rounds} interleaved rounds, medians.",
        "",
        "| pipeline | accuracy | escalated rows | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pipelines:
        acc, esc = quality[p]
        errors = sum(sum(lv["errors"].values()) for lv in results[p])
        lines.append(
            f"| {p} | {acc:.3f} | {esc:.1%} | {med(p, 'p50'):.2f} | {med(p, 'p95'):.2f} "
            f"| {med(p, 'p99'):.2f} | {errors} |"
        )
    report = "\n".join(lines)
    print(report)
    if not args.quick:
        write_section(
            "cascade",
            report,
            results={
                "settings": {"run": vars(args), "fast": FAST, "full": FULL, "batch": BATCH},
                "rounds": args.rounds,
                "values": results,  # pipeline -> its `milliserve bench` level, one per round
                "summary": {
                    p: {"accuracy": quality[p][0], "escalated": quality[p][1], "p99_ms": med(p, "p99")}
                    for p in pipelines
                },
            },
        )


if __name__ == "__main__":
    main()
