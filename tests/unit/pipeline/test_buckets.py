"""Length buckets (pipeline/buckets.py): which batches split, into what, and that the
pieces put back together pool to the same vectors."""

from __future__ import annotations

import numpy as np

from milliserve.pipeline import buckets
from milliserve.pipeline.pooling import pool


def _mask(lengths: list[int], seq: int | None = None, left: bool = False) -> np.ndarray:
    seq = seq or max(lengths)
    m = np.zeros((len(lengths), seq), dtype=np.int64)
    for i, n in enumerate(lengths):
        if left:
            m[i, seq - n :] = 1
        else:
            m[i, :n] = 1
    return m


def test_a_padded_batch_splits_into_runs_of_similar_length() -> None:
    rng = np.random.default_rng(1)
    lengths = [int(x) for x in rng.integers(5, 60, 32)]
    runs = buckets.plan(_mask(lengths))
    assert runs is not None
    rows = np.concatenate([r for r, _ in runs])
    assert sorted(rows.tolist()) == list(range(32))  # every row once
    assert [len(r) for r, _ in runs] == [buckets.ROWS] * 4
    widths = [w for _, w in runs]
    assert widths == sorted(widths) and widths[-1] == max(lengths)
    for r, w in runs:
        assert max(lengths[i] for i in r) == w
    padded = sum(len(r) * w for r, w in runs)
    assert padded < 32 * max(lengths)


def test_a_short_last_run_joins_the_one_before() -> None:
    runs = buckets.plan(_mask(list(range(1, 20))))  # 19 rows: 8, then 11
    assert runs is not None and [len(r) for r, _ in runs] == [8, 11]


def test_batches_that_run_as_one() -> None:
    assert buckets.plan(_mask([3, 50] * 7)) is None  # under MIN_ROWS
    assert buckets.plan(_mask([30] * 31 + [32])) is None  # little padding
    assert buckets.plan(_mask(list(range(1, 33)), left=True)) is None  # padded on the left
    assert buckets.plan(np.zeros((32, 4), dtype=np.int64)) is None  # nothing attended


def test_runs_put_back_pool_as_the_whole_batch() -> None:
    rng = np.random.default_rng(2)
    lengths = [int(x) for x in rng.integers(1, 40, 24)]
    mask = _mask(lengths, seq=45)
    hidden = rng.standard_normal((24, 45, 6)).astype(np.float32)
    runs = buckets.plan(mask)
    assert runs is not None
    # an encoder's answer for a run: the rows' states up to the run's width
    parts = [(rows, hidden[rows, :width]) for rows, width in runs]
    back = buckets.scatter(parts, 24, 45)
    assert back.shape == hidden.shape and back.dtype == hidden.dtype
    for mode in ("mean", "cls", "last_token"):
        np.testing.assert_allclose(pool(back, mask, mode), pool(hidden, mask, mode), rtol=1e-6)
