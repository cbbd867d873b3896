"""The seeds' mini project, end to end: a naive BERT-style sentiment service, then each
optimisation applied in turn, measured side by side on the same tweets and machine.

    python benchmarks/mini_project.py [--seconds 20] [--rounds 2] [--quick]

Steps (each one adds a single change to the one before):

1. naive: FastAPI + uvicorn, PyTorch FP32 eager, batch 1, transformers' tokenizer per
   request (benchmarks/apps/naive_sentiment.py);
2. ONNX export: the same service running the FP32 ONNX graph in ONNX Runtime;
3. optimize: the same service running the variant `milliserve optimize` shipped;
4. milliserve: that model served with dynamic batching (the client sends token ids,
   tokenized before the run: the client's tokenizing is not in the latency);
5. server-side tokenizer: raw text to the `sentiment` pipeline (Rust tokenizer);
6. Redis response cache: the same pipeline with `response_cache {backend: redis}`,
   Redis flushed before every run (each run starts cold);
7. gRPC: step 6 over gRPC.

Load: open-loop Poisson from `milliserve bench`, a Zipf (s = 1.1) stream over the 1000
held-out tweets. First each step's capacity at p99 ≤ 50 ms (rates raised by 1.4× until p99
or the not-served share fails; the search starts from the naive service's closed-loop
throughput at 4 connections), the naive service's included; then the fixed load, at 70% of
the lowest of those capacities, so that every step sustains it and a p99 ratio compares
services rather than one service's queue; rounds interleaved. Accuracy: the 1000 held-out tweets
through each step's endpoint. Writes the "mini-project" section of docs/benchmarks.md and
docs/img/mini-project-waterfall.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from mini_project_parts import (
    StepResult,
    accuracy_of,
    capacity_search,
    draw_waterfall,
    flush_redis,
    milliserve_stages,
    naive_settle,
    naive_stages,
    pause,
    render,
    wait_answering,
)
from report_sections import bench_level, commit, write_section
from server_overhead import cpu_description

from milliserve.bench.text_stream import repeat_share, text_stream, token_bodies
from milliserve.examples.build import build_examples
from milliserve.examples.sentiment import cache_dir, splits
from milliserve.examples.sentiment_pipeline import fp32_classifier
from milliserve.testing import RedisServer, ServerProcess, free_port

HERE = Path(__file__).resolve().parent
RESULTS = cache_dir() / "mini_project_results.json"  # the last full run, for --publish
ZIPF = 1.1
SLO_MS = 50.0
ACCURACY_PASSES = 3  # per milliserve step; the naive services answer one tweet at a time


@dataclass
class Step:
    name: str
    change: str
    url: str
    model: str
    data: list[str]  # bench's data flags
    accuracy: Callable[[], float]
    stages: Callable[[], dict[str, float]]  # mean ms per stage since the last call
    settle: Callable[[], None]  # wait until the server has no work left from the last run
    before_run: Callable[[], None] = lambda: None
    rows: list[dict[str, Any]] = field(default_factory=list)
    # accuracy passes: milliserve's batches mix the 4 concurrent tweets differently each pass,
    # and its INT8 dynamic model's scores move with their batch mates (docs/design.md)
    passes: int = 1


def _texts(quick: bool) -> tuple[list[str], np.ndarray[Any, Any]]:
    rows = splits(4000, 1000)["eval"]
    rows = rows[:200] if quick else rows
    texts = [" ".join(t.split()) or "." for t, _ in rows]  # one line each
    return texts, np.array([label for _, label in rows])


def _cached_pipeline(repo: Path) -> None:
    src, dst = repo / "sentiment", repo / "sentiment_cached"
    shutil.copytree(src, dst, dirs_exist_ok=True)
    text = (src / "config.yaml").read_text().replace("name: sentiment\n", "name: sentiment_cached\n")
    text = text.replace("budget:", "response_cache: {enable: true, backend: redis, ttl_s: 3600}\nbudget:", 1)
    (dst / "config.yaml").write_text(text)


def _naive(port: int, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(HERE / "apps" / "naive_sentiment.py"), str(port), *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def publish() -> None:
    """The section of docs/benchmarks.md and the chart, from the last full run's results."""
    saved = json.loads(RESULTS.read_text())
    results = [StepResult(**r) for r in saved["results"]]
    body = render(
        results,
        saved.get("naive_throughput", saved.get("naive_capacity", 0.0)),  # older runs: naive_capacity
        saved["load"],
        saved["rounds"],
        saved["seconds"],
        saved["cpu"],
        SLO_MS,
        saved.get("commit", ""),
    )
    print(body)
    img = HERE.parent / "docs" / "img" / "mini-project-waterfall.png"
    draw_waterfall(results, img)
    # the README's results table: capacity at the SLO, the naive service against milliserve
    # serving the same model (no cache: a cache's figure depends on how often requests repeat)
    naive, served = results[0], next((r for r in results if r.name == "4 milliserve"), None)
    headline = []
    if served is not None and naive.capacity > 0:
        headline.append(
            {
                "measure": f"sentiment service, capacity at p99 ≤ {SLO_MS:g} ms (no cache)",
                "milliserve": f"{served.capacity:.0f} req/s",
                "against": f"naive FastAPI + PyTorch, {naive.capacity:.0f} req/s",
                "ratio": f"{served.capacity / naive.capacity:.0f}×",
            }
        )
    write_section(
        "mini-project",
        body + f"\n![where the time went]({img.relative_to(HERE.parent / 'docs')})\n",
        results={
            "settings": {"load_req_s": saved["load"], "seconds": saved["seconds"], "slo_ms": SLO_MS},
            "rounds": saved["rounds"],
            "values": saved[
                "results"
            ],  # each step: its `milliserve bench` level per round, capacity, accuracy
            "summary": {"naive_throughput": saved.get("naive_throughput")},
            "headline": headline,
            "commit": saved.get("commit") or None,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a short run that checks the script works")
    parser.add_argument(
        "--publish", action="store_true", help="rewrite the section from the last run's results"
    )
    args = parser.parse_args()
    if args.publish:
        publish()
        return
    measured_at = commit()  # the checkout measured, read before the run (it may move meanwhile)
    seconds = 4.0 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds
    work = Path(tempfile.mkdtemp(prefix="mini-project-"))
    repo = work / "repo"
    built = build_examples(repo, only=["sentiment"])["sentiment"]
    _cached_pipeline(repo)
    texts, labels = _texts(args.quick)
    (work / "texts.txt").write_text("\n".join(texts) + "\n")
    stream = text_stream(texts, ZIPF)
    (work / "tokens.json").write_bytes(
        orjson.dumps(token_bodies(stream, repo / "sentiment" / "tokenizer.json"))
    )
    repeats = repeat_share(stream[:2000])

    procs: list[subprocess.Popen[bytes]] = []
    redis = RedisServer()
    redis.start()
    server = ServerProcess(repo, "--redis-url", redis.url, ready_timeout_s=180)
    try:
        server.start()
        ports = {k: free_port() for k in ("torch", "onnx", "int8")}
        procs.append(_naive(ports["torch"]))
        procs.append(_naive(ports["onnx"], "--engine", "onnx", "--model", str(fp32_classifier())))
        procs.append(
            _naive(ports["int8"], "--engine", "onnx", "--model", str(repo / "sentiment_model/1/model.onnx"))
        )
        for port in ports.values():
            wait_answering(f"http://127.0.0.1:{port}")
        ms_http, ms_grpc = f"http://{server.http_url}", f"grpc://{server.grpc_url}"
        text_data = ["--data", str(work / "texts.txt"), "--zipf", str(ZIPF)]
        naive_data = [*text_data, "--text-input", "TEXT", "--json-tensors"]
        client = httpx.Client(timeout=30)
        steps = [
            Step(
                "1 naive",
                "FastAPI + PyTorch FP32 eager, batch 1, Python tokenizer per request",
                f"http://127.0.0.1:{ports['torch']}",
                "sentiment",
                naive_data,
                accuracy_of(client, f"http://127.0.0.1:{ports['torch']}", "sentiment", texts, labels),
                naive_stages(client, f"http://127.0.0.1:{ports['torch']}"),
                naive_settle(client, f"http://127.0.0.1:{ports['torch']}"),
            ),
            Step(
                "2 ONNX export",
                "the same service on the FP32 ONNX graph (ONNX Runtime)",
                f"http://127.0.0.1:{ports['onnx']}",
                "sentiment",
                naive_data,
                accuracy_of(client, f"http://127.0.0.1:{ports['onnx']}", "sentiment", texts, labels),
                naive_stages(client, f"http://127.0.0.1:{ports['onnx']}"),
                naive_settle(client, f"http://127.0.0.1:{ports['onnx']}"),
            ),
            Step(
                "3 optimize",
                f"the same service on the variant `milliserve optimize` shipped ({built.shipped})",
                f"http://127.0.0.1:{ports['int8']}",
                "sentiment",
                naive_data,
                accuracy_of(client, f"http://127.0.0.1:{ports['int8']}", "sentiment", texts, labels),
                naive_stages(client, f"http://127.0.0.1:{ports['int8']}"),
                naive_settle(client, f"http://127.0.0.1:{ports['int8']}"),
            ),
            Step(
                "4 milliserve",
                "that model served by milliserve, dynamic batching (client sends token ids)",
                ms_http,
                "sentiment_model",
                ["--data", str(work / "tokens.json")],
                accuracy_of(
                    client,
                    ms_http,
                    "sentiment_model",
                    texts,
                    labels,
                    tokens=repo / "sentiment/tokenizer.json",
                ),
                milliserve_stages(client, server.metrics_url, "sentiment_model"),
                pause(),
                passes=ACCURACY_PASSES,
            ),
            Step(
                "5 server tokenizer",
                "raw text to the `sentiment` pipeline: Rust tokenizer in the server",
                ms_http,
                "sentiment",
                text_data,
                accuracy_of(client, ms_http, "sentiment", texts, labels),
                milliserve_stages(client, server.metrics_url, "sentiment"),
                pause(),
                passes=ACCURACY_PASSES,
            ),
            Step(
                "6 Redis cache",
                f"response cache on Redis; Zipf s={ZIPF} stream, {repeats:.0%} repeats in its first 2000",
                ms_http,
                "sentiment_cached",
                text_data,
                accuracy_of(client, ms_http, "sentiment_cached", texts, labels),
                milliserve_stages(client, server.metrics_url, "sentiment_cached"),
                pause(),
                before_run=lambda: flush_redis(redis.port),
                passes=ACCURACY_PASSES,
            ),
            Step(
                "7 gRPC",
                "step 6 over gRPC",
                ms_grpc,
                "sentiment_cached",
                text_data,
                accuracy_of(client, ms_grpc, "sentiment_cached", texts, labels),
                milliserve_stages(client, server.metrics_url, "sentiment_cached"),
                pause(),
                before_run=lambda: flush_redis(redis.port),
                passes=ACCURACY_PASSES,
            ),
        ]
        naive = steps[0]
        cap_level = bench_level(
            naive.url, naive.model, work / "cap.json", "--concurrency", "4", *naive.data, seconds=seconds
        )
        naive_throughput = cap_level["throughput"]  # where the capacity searches start
        naive.settle()
        capacities = {}
        for step in steps:  # capacity at the SLO first: the fixed load must be one all sustain
            capacities[step.name] = capacity_search(step, naive_throughput, work, seconds, SLO_MS)
            print(
                f"{step.name}: capacity {capacities[step.name]:.0f} req/s at p99 <= {SLO_MS:.0f} ms",
                flush=True,
            )
        load = round(0.7 * min(capacities.values()), 1)
        print(
            f"naive closed-loop throughput {naive_throughput:.1f} req/s (4 connections); lowest capacity "
            f"{min(capacities.values()):.1f} req/s; load {load} req/s",
            flush=True,
        )
        for r in range(rounds):
            for step in steps:
                step.before_run()
                step.stages()  # reset the stage sums
                level = bench_level(
                    step.url,
                    step.model,
                    work / "level.json",
                    "--rate",
                    str(load),
                    *step.data,
                    seconds=seconds,
                )
                level["stages_ms"] = step.stages()
                step.settle()
                step.rows.append(level)
                print(
                    f"round {r + 1} {step.name}: p99 {level['latency_us']['p99'] / 1000:.1f} ms", flush=True
                )
        results = []
        for step in steps:
            capacity = capacities[step.name]
            accuracies = []
            for _ in range(step.passes):
                step.before_run()  # a cached step answers each pass afresh
                accuracies.append(step.accuracy())
            accuracy = float(np.median(accuracies))
            results.append(StepResult(step.name, step.change, step.rows, capacity, accuracy, accuracies))
        if args.quick:  # a quick run checks the script; its numbers are not a measurement
            print(render(results, naive_throughput, load, rounds, seconds, cpu_description(), SLO_MS))
            draw_waterfall(results, work.parent / "mini-project-waterfall.png")
        else:
            saved = {"results": [asdict(r) for r in results], "naive_throughput": naive_throughput}
            saved["load"] = load
            saved |= {"rounds": rounds, "seconds": seconds, "cpu": cpu_description(), "commit": measured_at}
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(saved))
            publish()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        server.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
