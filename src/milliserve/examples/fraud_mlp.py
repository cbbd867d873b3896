"""``fraud_mlp``: a small MLP fraud scorer trained here on synthetic transactions.

64 features per transaction, 64 -> 256 -> 256 -> 2 with ReLU and softmax, trained
with numpy (Adam, cross-entropy) in a couple of seconds, then written as ONNX
with a Triton ``config.pbtxt`` that turns dynamic batching on.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["FEATURES", "FraudReport", "build_fraud_mlp", "synthetic_transactions"]

FEATURES = 64
HIDDEN = 256

CONFIG_PBTXT = """\
name: "fraud_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "features" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 200
  default_queue_policy { max_queue_size: 1024 }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


@dataclass(frozen=True, slots=True)
class FraudReport:
    train_rows: int
    test_accuracy: float
    fraud_rate: float


def synthetic_transactions(n: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Features (n, 64) float32 and labels (n,) int64 with a nonlinear fraud rule and noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    # amount, velocity, new-device and geo-distance signals interact
    amount, velocity, device, distance = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
    logit = 2.0 * amount + 1.5 * amount * velocity + 2.0 * np.tanh(2 * device * distance)
    logit += 0.5 * x[:, 4:8].sum(1) + rng.normal(scale=0.3, size=n) - 2.5
    y = (logit > 0).astype(np.int64)
    return x, y


def _train(
    x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], epochs: int, seed: int
) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    sizes = [FEATURES, HIDDEN, HIDDEN, 2]
    params: list[np.ndarray[Any, Any]] = []
    for a, b in itertools.pairwise(sizes):
        params.append((rng.normal(size=(a, b)) * np.sqrt(2.0 / a)).astype(np.float32))
        params.append(np.zeros(b, dtype=np.float32))
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    lr, b1, b2, step = 1e-3, 0.9, 0.999, 0
    onehot = np.eye(2, dtype=np.float32)[y]
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 256):
            idx = order[start : start + 256]
            xb, yb = x[idx], onehot[idx]
            w1, c1, w2, c2, w3, c3 = params
            h1 = np.maximum(xb @ w1 + c1, 0)
            h2 = np.maximum(h1 @ w2 + c2, 0)
            z = h2 @ w3 + c3
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            dz = (p - yb) / len(xb)
            dh2 = (dz @ w3.T) * (h2 > 0)
            dh1 = (dh2 @ w2.T) * (h1 > 0)
            grads = [xb.T @ dh1, dh1.sum(0), h1.T @ dh2, dh2.sum(0), h2.T @ dz, dz.sum(0)]
            step += 1
            for i, g in enumerate(grads):
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                mhat = m[i] / (1 - b1**step)
                vhat = v[i] / (1 - b2**step)
                params[i] -= (lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
    return params


def _to_onnx(params: list[np.ndarray[Any, Any]]) -> onnx.ModelProto:
    names = ["w1", "b1", "w2", "b2", "w3", "b3"]
    inits = [numpy_helper.from_array(p, n) for p, n in zip(params, names, strict=True)]
    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["g1"]),
        helper.make_node("Relu", ["g1"], ["r1"]),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["g2"]),
        helper.make_node("Relu", ["g2"], ["r2"]),
        helper.make_node("Gemm", ["r2", "w3", "b3"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "fraud_mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="milliserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build_fraud_mlp(repo: Path, rows: int = 20000, epochs: int = 6, seed: int = 0) -> FraudReport:
    """Train and write ``repo/fraud_mlp/{config.pbtxt, 1/model.onnx}``."""
    x, y = synthetic_transactions(rows + 4000, seed)
    params = _train(x[:rows], y[:rows], epochs, seed)
    w1, c1, w2, c2, w3, c3 = params
    xt, yt = x[rows:], y[rows:]
    pred = (np.maximum(np.maximum(xt @ w1 + c1, 0) @ w2 + c2, 0) @ w3 + c3).argmax(1)
    model_dir = repo / "fraud_mlp"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(_to_onnx(params), str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(CONFIG_PBTXT, encoding="utf-8")
    return FraudReport(rows, float((pred == yt).mean()), float(y.mean()))
