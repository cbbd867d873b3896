"""``Soon``: a result delivered later in the loop's turn, once, to whoever asked for it."""

from __future__ import annotations

import pytest

from milliserve.runtime.soon import Soon


def test_a_result_reaches_its_taker_whether_it_came_before_or_after() -> None:
    seen: list[object] = []
    early: Soon[int] = Soon()
    early.settle(1)
    early.then(seen.append)
    late: Soon[int] = Soon()
    late.then(seen.append)
    assert seen == [1]
    late.settle(2)
    assert seen == [1, 2]
    with pytest.raises(RuntimeError, match="settled twice"):
        late.settle(3)


def test_map_passes_errors_through_its_handler_and_a_failing_map_as_an_error() -> None:
    seen: list[object] = []
    ok: Soon[int] = Soon()
    ok.map(lambda v: v * 10, lambda e: -1).then(seen.append)
    ok.settle(4)
    failed: Soon[int] = Soon()
    failed.map(lambda v: v * 10, lambda e: -1).then(seen.append)
    failed.settle(ValueError("no"))
    passed: Soon[int] = Soon()
    passed.map(lambda v: v * 10, lambda e: e).then(seen.append)
    passed.settle(KeyError("k"))
    broken: Soon[int] = Soon()
    broken.map(lambda v: 1 // v, lambda e: e).then(seen.append)
    broken.settle(0)
    assert seen[:2] == [40, -1]
    assert isinstance(seen[2], KeyError) and isinstance(seen[3], ZeroDivisionError)
