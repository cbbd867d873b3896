"""The one percentile convention: nearest rank, always a measured value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from milliserve.percentiles import percentile, percentiles


def test_nearest_rank_of_one_to_a_hundred() -> None:
    values = list(range(100, 0, -1))  # order does not matter
    assert percentiles(values, [0, 1, 50, 95, 99, 99.9, 100]) == [1, 1, 50, 95, 99, 100, 100]


def test_a_percentile_is_a_measured_value_never_an_interpolation() -> None:
    assert percentile([1.0, 2.0], 50) == 1.0  # numpy's default would say 1.5
    assert percentile([1.0, 2.0], 51) == 2.0
    assert percentile([7.0], 99.9) == 7.0


def test_agrees_with_the_rank_formula_on_random_samples() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 99, 100, 101, 1000, 4097):
        x = rng.normal(size=n)
        ordered = np.sort(x)
        for p in (0, 2.5, 50, 90, 95, 97.5, 99, 99.9, 100):
            rank = max(1, math.ceil(round(p * n / 100, 9)))
            assert percentile(x, p) == ordered[rank - 1], (n, p)


def test_floating_point_does_not_move_the_rank() -> None:
    # 99.9 / 100 * 1000 is 999.0000000000001 in floating point: still the 999th value
    assert percentile(np.arange(1, 1001), 99.9) == 999


def test_no_values_or_a_p_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        percentile([1.0], 101)
