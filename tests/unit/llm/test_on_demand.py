"""Which generative model unloads for another under the memory cap (repository/on_demand.py):
the least recently used idle one, as many as the new one needs, never a busy one (a load
waits for it, then gives up with a 503), and none when the new one fits or is alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from milliserve.errors import QueueFullError
from milliserve.repository.on_demand import OnDemand, resident_bytes

MIB = 1 << 20


def _room(od: OnDemand, loaded: list[str], busy: set[str], need: int = 100 * MIB) -> list[str]:
    """Make room for ``new`` beside ``loaded`` (each 100 MiB); the models unloaded, in order."""
    unloaded: list[str] = []

    async def unload(name: str) -> None:
        loaded.remove(name)
        unloaded.append(name)

    asyncio.run(
        od.make_room("new", need, lambda: list(loaded), lambda n: 100 * MIB, busy.__contains__, unload)
    )
    return unloaded


def test_the_least_recently_used_idle_models_unload_until_the_new_one_fits() -> None:
    od = OnDemand(250 * MIB)
    for name in ("b", "a", "c"):  # c used last, a before it, b first
        od.touch(name)
    assert _room(od, ["a", "b", "c"], set()) == ["b", "a"]  # 300 + 100 > 250, then 200 + 100


def test_a_busy_model_is_passed_over() -> None:
    od = OnDemand(250 * MIB)
    for name in ("b", "a", "c"):
        od.touch(name)
    assert _room(od, ["a", "b", "c"], {"b"}) == ["a", "c"]


def test_nothing_unloads_when_the_new_one_fits_or_is_alone() -> None:
    od = OnDemand(250 * MIB)
    od.touch("a")
    assert _room(od, ["a"], set()) == []  # 100 + 100 <= 250
    assert _room(od, [], set(), need=1000 * MIB) == []  # alone, over the cap: nothing to unload


def test_a_load_that_only_busy_models_could_make_room_for_gives_up() -> None:
    od = OnDemand(150 * MIB, wait_s=0.2)
    od.touch("a")
    with pytest.raises(QueueFullError, match="busy"):
        _room(od, ["a"], {"a"})


def test_a_model_is_expected_to_take_its_files_until_it_was_measured(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.gguf").write_bytes(b"x" * 1000)
    od = OnDemand(MIB)
    assert od.expected("m", tmp_path) == 1000
    od.measured("m", 5000)
    assert od.expected("m", tmp_path) == 5000 and od.loads == 1
    assert resident_bytes() > 0
