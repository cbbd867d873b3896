"""The data docs/tutorial-sentiment.md works from (``milliserve examples data DIR``).

Apart from ``sentiment`` (the tweets and the torch classifier) and ``sentiment_pipeline``
(the served models): it needs both, and ``sentiment_pipeline`` builds on ``sentiment``,
so in either of them it made the two import each other.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from milliserve.bench.text_stream import text_stream, token_bodies
from milliserve.examples.minilm import tokenizer_path
from milliserve.examples.sentiment import splits, write_data
from milliserve.examples.sentiment_pipeline import fp32_classifier

__all__ = ["write_tutorial_data"]


def write_tutorial_data(directory: Path, n_eval: int = 1000, zipf: float = 1.1) -> dict[str, Path]:
    """What docs/tutorial-sentiment.md works from: the held-out tweets as ``eval.txt`` (one a
    line) and ``eval.npz`` (48 tokens, with labels), ``calib.npz``, the FP32 classifier
    ``sentiment_fp32.onnx`` (MiniLM + head, the graph ``optimize`` starts from) and
    ``stream_tokens.json``: a Zipf stream over the tweets as token-id request bodies."""
    paths = write_data(directory, n_train=200, n_eval=n_eval, n_calib=128)
    texts = [" ".join(t.split()) or "." for t, _ in splits(200, n_eval)["eval"]]
    paths["texts"] = directory / "eval.txt"
    paths["texts"].write_text("\n".join(texts) + "\n", encoding="utf-8")
    paths["model"] = directory / "sentiment_fp32.onnx"
    shutil.copyfile(fp32_classifier(), paths["model"])
    paths["stream"] = directory / "stream_tokens.json"
    stream = text_stream(texts, zipf, length=5000)
    paths["stream"].write_bytes(orjson.dumps(token_bodies(stream, tokenizer_path())))
    (directory / "train.npz").unlink(missing_ok=True)  # the tutorial trains nothing
    paths.pop("train", None)
    return paths
