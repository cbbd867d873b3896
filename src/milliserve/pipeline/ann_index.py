"""An approximate nearest-neighbour index over text embeddings, and its files.

Backed by hnswlib (HNSW graphs; chosen over faiss-cpu by measurement, see the
"ann-choice" section of docs/benchmarks.md), imported only when an index is built or
loaded, so the server runs without it until a pipeline has an ``ann`` step.

On disk an index at ``PATH`` is three files, none of them a pickle:

- ``PATH``: hnswlib's own index file (the graph and the vectors);
- ``PATH.json``: what the index is (format, library and version, metric, dim, count,
  the encoder's name, the HNSW parameters);
- ``PATH.npz`` (read with ``allow_pickle=False``): ``ids`` (int64), and the texts as one
  UTF-8 ``blob`` (uint8) cut at ``offsets`` (int64, count + 1).

Scores are inner products (``metric: ip``, for L2-normalised embeddings: the cosine), or
cosines (``metric: cosine``: hnswlib normalises the vectors), higher is nearer.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from milliserve.errors import ConfigError

__all__ = ["FORMAT", "INSTALL_HINT", "AnnIndex", "HnswParams", "Metric", "import_hnswlib"]

FORMAT = "milliserve-ann/1"
INSTALL_HINT = "pip install 'milliserve[ann]'"
Metric = Literal["ip", "cosine"]


def import_hnswlib() -> Any:
    """The hnswlib module, or ImportError saying how to install it."""
    try:
        import hnswlib
    except ImportError as exc:
        raise ImportError(f"an ann index needs hnswlib: {INSTALL_HINT}") from exc
    return hnswlib


@dataclass(frozen=True, slots=True)
class HnswParams:
    """HNSW's knobs: ``m`` links per node, ``ef_construction`` the build's search breadth,
    ``ef`` the search breadth (hnswlib searches with max(ef, k)). The defaults reach a
    recall@10 of 0.96 on 20k MiniLM tweet embeddings in about 0.1 ms a query; ef=128 gives
    0.98 in twice the time (docs/benchmarks.md, "ann-choice")."""

    m: int = 16
    ef_construction: int = 200
    ef: int = 64
    seed: int = 100

    def __post_init__(self) -> None:
        for name in ("m", "ef_construction", "ef"):
            if getattr(self, name) < 1:
                raise ValueError(f"HNSW {name} must be >= 1, got {getattr(self, name)}")


def _sidecars(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.name + ".json"), path.with_name(path.name + ".npz")


class AnnIndex:
    """Vectors with ids and texts, searched by HNSW. ``search`` is thread-safe for reads."""

    def __init__(self, hnsw: Any, ids: Any, offsets: Any, blob: Any, meta: dict[str, Any]) -> None:
        self.hnsw, self.ids, self.offsets, self.blob, self.meta = hnsw, ids, offsets, blob, meta
        self.dim: int = int(meta["dim"])
        self.count: int = int(meta["count"])
        self.metric: Metric = meta["metric"]
        self.model: str = meta.get("model", "")

    @classmethod
    def build(
        cls,
        vectors: Any,
        texts: list[str],
        ids: Any | None = None,
        params: HnswParams | None = None,
        metric: Metric = "ip",
        model: str = "",
        threads: int = -1,
    ) -> AnnIndex:
        """An index over ``vectors`` (FP32 [n, dim]); ``ids`` default to 0..n-1. Raises
        ValueError when the sizes disagree, ImportError without hnswlib."""
        hnswlib = import_hnswlib()
        p = params or HnswParams()
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        n = len(x)
        ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        if x.ndim != 2 or n == 0 or len(texts) != n or ids.shape != (n,):
            raise ValueError(
                f"an index needs vectors [n, dim] with n texts and n ids; got vectors "
                f"{list(x.shape)}, {len(texts)} texts, ids {list(ids.shape)}"
            )
        hnsw = hnswlib.Index(space=metric, dim=x.shape[1])
        hnsw.init_index(max_elements=n, ef_construction=p.ef_construction, M=p.m, random_seed=p.seed)
        hnsw.add_items(x, np.arange(n), num_threads=threads)  # labels are row numbers
        hnsw.set_ef(p.ef)
        encoded = [t.encode() for t in texts]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        meta = {
            "format": FORMAT,
            "library": "hnswlib",
            "library_version": _version("hnswlib"),
            "metric": metric,
            "dim": int(x.shape[1]),
            "count": n,
            "model": model,
            "params": asdict(p),
        }
        return cls(hnsw, ids, offsets, blob, meta)

    def save(self, path: Path) -> None:
        """Write the index and its two sidecars (``PATH.json``, ``PATH.npz``)."""
        meta_path, data_path = _sidecars(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.hnsw.save_index(str(path))
        with data_path.open("wb") as f:
            np.savez(f, ids=self.ids, offsets=self.offsets, blob=self.blob)
        meta_path.write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> AnnIndex:
        """Read an index saved by ``save``. Raises ConfigError for a missing or inconsistent
        file, ImportError without hnswlib."""
        meta_path, data_path = _sidecars(path)
        for p in (path, meta_path, data_path):
            if not p.is_file():
                raise ConfigError(
                    f"ann index {path}: no file {p.name} (build it with `milliserve index build`)"
                )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ConfigError(f"ann index {meta_path}: not JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("library") != "hnswlib":
            got = meta.get("format") if isinstance(meta, dict) else None
            raise ConfigError(f"ann index {meta_path}: format {got!r}, expected {FORMAT!r} (hnswlib)")
        hnswlib = import_hnswlib()
        with np.load(data_path, allow_pickle=False) as f:
            ids, offsets, blob = f["ids"], f["offsets"], f["blob"]
        count, dim = int(meta["count"]), int(meta["dim"])
        if ids.shape != (count,) or offsets.shape != (count + 1,) or int(offsets[-1]) != len(blob):
            raise ConfigError(f"ann index {data_path}: ids or texts do not match count {count}")
        stored = _stored_dim(path)
        if stored != dim:  # hnswlib trusts the dim it is given: a wrong one reads out of bounds
            raise ConfigError(
                f"ann index {path}: holds vectors of dim {stored}, {meta_path.name} says {dim}; "
                "rebuild it with `milliserve index build`"
            )
        hnsw = hnswlib.Index(space=meta["metric"], dim=dim)
        try:
            hnsw.load_index(str(path), max_elements=count)
        except RuntimeError as exc:
            raise ConfigError(f"ann index {path}: hnswlib cannot read it ({exc})") from None
        if hnsw.get_current_count() != count:
            raise ConfigError(
                f"ann index {path}: holds {hnsw.get_current_count()} vectors, {meta_path.name} says {count}"
            )
        hnsw.set_ef(int(meta["params"]["ef"]))
        hnsw.set_num_threads(1)
        return cls(hnsw, ids, offsets, blob, meta)

    def search(self, queries: Any, k: int) -> tuple[Any, Any]:
        """Row numbers (int64 [n, k]) and scores (FP32 [n, k], higher is nearer) of each
        query's k nearest vectors, on the calling thread (hnswlib lets go of the GIL and
        searches with breadth max(ef, k)). ``k`` must not exceed ``count``."""
        rows, dist = self.hnsw.knn_query(queries, k=k, num_threads=1)
        return rows.astype(np.int64, copy=False), (1.0 - dist).astype(np.float32, copy=False)

    def texts(self, rows: Any) -> Any:
        """The stored texts of ``rows`` as an object array of UTF-8 bytes, shaped like ``rows``."""
        flat = rows.reshape(-1)
        start, end = self.offsets[flat], self.offsets[flat + 1]
        blob = self.blob
        out = np.empty(len(flat), dtype=object)
        out[:] = [blob[s:e].tobytes() for s, e in zip(start.tolist(), end.tolist(), strict=True)]
        return out.reshape(rows.shape)


def _stored_dim(path: Path) -> int | None:
    """The vector dim an hnswlib file was written with, from its header: six size_t fields
    (level-0 offset, max elements, count, bytes per element, label offset, data offset);
    the FP32 vector sits between the data offset and the label. None if unreadable."""
    with path.open("rb") as f:
        head = f.read(48)
    if len(head) < 48:
        return None
    *_, per_element, label_offset, data_offset = struct.unpack("<6Q", head)
    size = label_offset - data_offset
    if not 0 < size <= per_element or size % 4:
        return None
    return int(size) // 4


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
