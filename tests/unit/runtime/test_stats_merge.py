"""Triton statistics of several workers summed as one server's (``serve --workers N``)."""

from __future__ import annotations

from typing import Any

from milliserve.runtime.stats import merge_statistics


def _dur(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def _model(version: str, inferences: int, last: int, batches: dict[int, int]) -> dict[str, Any]:
    return {
        "name": "m",
        "version": version,
        "last_inference": last,
        "inference_count": inferences,
        "inference_stats": {"success": _dur(inferences, inferences * 10)},
        "batch_stats": [
            {"batch_size": size, "compute_infer": _dur(n, n * 100)} for size, n in sorted(batches.items())
        ],
    }


def test_counts_add_up_and_what_identifies_an_entry_does_not() -> None:
    a = [_model("1", 14, 100, {1: 4, 2: 3, 4: 7})]
    b = [_model("1", 18, 250, {1: 10, 2: 3, 8: 5})]
    (merged,) = merge_statistics([a, b])
    assert merged["name"] == "m" and merged["version"] == "1"
    assert merged["inference_count"] == 32 and merged["last_inference"] == 250
    assert merged["inference_stats"]["success"] == {"count": 32, "ns": 320}
    by_size = {s["batch_size"]: s["compute_infer"]["count"] for s in merged["batch_stats"]}
    assert by_size == {1: 14, 2: 6, 4: 7, 8: 5}  # a size one worker never ran is kept once


def test_versions_and_models_stay_apart() -> None:
    merged = merge_statistics([[_model("1", 1, 1, {1: 1})], [_model("2", 2, 2, {1: 2})], []])
    assert [(m["version"], m["inference_count"]) for m in merged] == [("1", 1), ("2", 2)]
    assert merge_statistics([]) == []
