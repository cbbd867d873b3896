"""The public API is explicit: what __init__ exports, sorted."""

from __future__ import annotations

import milliserve


def test_all_is_sorted_and_complete() -> None:
    assert milliserve.__all__ == sorted(milliserve.__all__)
    for name in milliserve.__all__:
        assert hasattr(milliserve, name), name
    public = {n for n in vars(milliserve) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if type(getattr(milliserve, n)).__name__ == "module"}
    assert public - modules == set(milliserve.__all__) - {"__version__"}
