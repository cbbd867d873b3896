"""Request bodies from a text file, for models that take raw text (a ``BYTES`` input):
``milliserve bench URL -m sentiment --data tweets.txt [--zipf 1.1]``.

One text per line (empty lines skipped). Without ``--zipf`` each text is sent once, in
file order, round after round. With ``--zipf S`` the stream repeats texts the way real
traffic does: the text on line ``r`` comes with probability proportional to ``1 / r**S``
(seeded, so two runs send the same stream), which is what a response cache meets in
production; the report prints the share of repeats so the cache's hit rate can be read
against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from milliserve.errors import ConfigError

__all__ = ["STREAM_LENGTH", "read_texts", "repeat_share", "text_stream", "token_bodies"]

STREAM_LENGTH = 20_000  # bodies in a Zipf stream; the load generator cycles through them
MAX_TEXTS = 1_000_000


def read_texts(path: Path) -> list[str]:
    """The non-empty lines of ``path`` (UTF-8). Raises ConfigError when there are none."""
    texts = []
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            text = line.rstrip("\r\n")
            if text.strip():
                texts.append(text)
            if len(texts) > MAX_TEXTS:
                raise ConfigError(f"{path}: more than {MAX_TEXTS:,} texts; give a sample")
    if not texts:
        raise ConfigError(f"{path}: no texts (one per line)")
    return texts


def text_stream(
    texts: list[str], zipf: float | None, length: int = STREAM_LENGTH, seed: int = 0
) -> list[str]:
    """``texts`` in order, or ``length`` draws with Zipf exponent ``zipf`` over their ranks."""
    if zipf is None:
        return texts
    if zipf <= 0:
        raise ConfigError(f"--zipf {zipf}: give an exponent > 0 (1.1 is typical of search and chat traffic)")
    weights = 1.0 / np.arange(1, len(texts) + 1, dtype=np.float64) ** zipf
    ranks = np.random.default_rng(seed).choice(len(texts), size=length, p=weights / weights.sum())
    return [texts[i] for i in ranks]


def repeat_share(stream: list[str]) -> float:
    """The share of requests whose text was sent before: an unbounded cache's hit rate."""
    return 1.0 - len(set(stream)) / len(stream) if stream else 0.0


def token_bodies(texts: list[str], tokenizer_json: Path, max_length: int = 64) -> list[dict[str, Any]]:
    """OIP request bodies of token ids (``input_ids``, ``attention_mask``), one text each:
    what a client that tokenizes for itself sends to a bare encoder or classifier."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()  # a tokenizer.json may pad to a fixed length (MiniLM's pads to 128)
    tok.enable_truncation(max_length)
    bodies = []
    for e in tok.encode_batch(texts):
        shape = [1, len(e.ids)]
        bodies.append(
            {
                "inputs": [
                    {"name": "input_ids", "datatype": "INT64", "shape": shape, "data": e.ids},
                    {"name": "attention_mask", "datatype": "INT64", "shape": shape, "data": e.attention_mask},
                ]
            }
        )
    return bodies
