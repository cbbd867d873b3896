"""``milliserve examples build DIR``: write the example model repository (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from milliserve.examples.fraud_mlp import build_fraud_mlp
from milliserve.examples.minilm import build_minilm

__all__ = ["EXAMPLES", "build_examples"]

EXAMPLES: dict[str, Callable[[Path], object]] = {
    "fraud_mlp": build_fraud_mlp,
    "minilm": build_minilm,
}


def build_examples(
    repo: Path, only: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, object]:
    """Build the named examples (all by default) into ``repo``; returns what each builder reported.

    Raises KeyError naming an unknown example, ImportError when a packaged model is missing.
    """
    names = only or list(EXAMPLES)
    unknown = sorted(set(names) - set(EXAMPLES))
    if unknown:
        raise KeyError(f"unknown examples {unknown}; choose from {sorted(EXAMPLES)}")
    repo.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {}
    for name in names:
        if progress:
            progress(name)
        results[name] = EXAMPLES[name](repo)
    return results
