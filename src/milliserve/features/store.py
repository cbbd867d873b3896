"""Online features: a model declares the features it needs, the request brings entity
ids, and the server fetches the rows and assembles the model's input tensor.

Sources: an in-process table loaded from CSV (or Parquet, with pyarrow installed), the
embedded default, or Redis hashes keyed ``<prefix><entity id>`` (one field per feature),
fetched for a whole batch in one pipeline. A missing entity gets the declared defaults;
a Redis that is down or slow gives the defaults too (and the response says so) or fails
the request, as the config chooses.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from milliserve.config.step_config import Features
from milliserve.errors import ConfigError, UnavailableError
from milliserve.redis_client import BoundedRedis, Breaker

__all__ = [
    "FeatureLookup",
    "FeatureSet",
    "RedisFeatures",
    "TableFeatures",
    "load_table",
    "write_table_to_redis",
]

log = logging.getLogger(__name__)


def load_table(path: Path, key: str) -> tuple[list[str], dict[str, list[str]]]:
    """Rows of a CSV or Parquet file by ``key``: (column names, {id: [values...]})."""
    if not path.is_file():
        raise ConfigError(f"feature table {path}: no such file")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(
                f"{path}: reading Parquet needs pyarrow (pip install pyarrow); or use CSV"
            ) from None
        table = pq.read_table(path).to_pydict()
        columns = list(table)
        rows = [[str(table[c][i]) for c in columns] for i in range(len(table[columns[0]]) if columns else 0)]
    else:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            columns = next(reader, [])
            rows = list(reader)
    if key not in columns:
        raise ConfigError(f"feature table {path}: no key column {key!r} (columns: {columns})")
    k = columns.index(key)
    return columns, {r[k]: r for r in rows}


class FeatureLookup(Protocol):
    async def fetch(
        self, ids: list[str], deadline: float | None = None
    ) -> tuple[list[list[float] | None], bool]:
        """Feature rows per id (None when the entity is unknown) and whether the source was
        unavailable (all rows None then). ``deadline`` (an absolute ``time.perf_counter()``,
        or None) bounds a source that waits on something."""
        ...


class TableFeatures:
    """The embedded default: the whole table in memory, as float32 rows."""

    def __init__(self, path: Path, key: str, names: list[str]) -> None:
        columns, rows = load_table(path, key)
        missing = [n for n in names if n not in columns]
        if missing:
            raise ConfigError(f"feature table {path}: no columns {missing} (columns: {columns})")
        idx = [columns.index(n) for n in names]
        self.rows: dict[str, list[float]] = {}
        for entity, row in rows.items():
            try:
                self.rows[entity] = [float(row[i]) for i in idx]
            except ValueError:
                raise ConfigError(
                    f"feature table {path}: entity {entity!r} has a non-numeric feature"
                ) from None
        self.index = {entity: i for i, entity in enumerate(self.rows)}
        self.matrix = np.array(list(self.rows.values()), dtype=np.float32).reshape(len(self.rows), len(idx))

    async def fetch(
        self, ids: list[str], deadline: float | None = None
    ) -> tuple[list[list[float] | None], bool]:
        return [self.rows.get(i) for i in ids], False

    def fill_nan(self, defaults: np.ndarray[Any, Any]) -> bool:
        """Give every NaN of the table its column's default; whether the table is now free
        of NaNs (a NaN default leaves them)."""
        nan = np.isnan(self.matrix)
        if not nan.any():
            return True
        self.matrix[nan] = np.broadcast_to(defaults, self.matrix.shape)[nan]
        return not np.isnan(self.matrix).any()

    def take(
        self, ids: list[str], defaults: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The [len(ids), n] rows in one gather, ``defaults`` where an id is unknown; and which
        were. (A whole batch's rows cost about what one row's did through ``fetch``.)"""
        get = self.index.get
        rows = [get(i, -1) for i in ids]
        if len(self.matrix) and -1 not in rows:  # every entity known: one gather
            return self.matrix[rows], np.zeros(len(rows), dtype=bool)
        found = np.array(rows, dtype=np.intp)
        unknown = found < 0
        out = self.matrix[found] if len(self.matrix) else np.empty((len(ids), len(defaults)), np.float32)
        if unknown.any():
            out[unknown] = defaults
        return out, unknown


class RedisFeatures:
    """Redis hashes ``<prefix><id>``, one HMGET per entity, pipelined for the batch.

    Every call is bounded by ``timeout_s`` and by the request's deadline (no time left:
    Redis is skipped and the source reported unavailable, which is not a Redis failure).
    Failures feed the breaker Redis response caches use: 5 within 1 s leave Redis alone
    for ``backoff_s``, then one trial call decides."""

    def __init__(
        self, url: str, prefix: str, names: list[str], timeout_s: float, backoff_s: float = 1.0
    ) -> None:
        self.prefix, self.names, self.timeout_s, self.backoff_s = prefix, names, timeout_s, backoff_s
        self.redis = BoundedRedis(url, "feature store (redis)", timeout_s, backoff_s)

    @property
    def breaker(self) -> Breaker:
        return self.redis.breaker

    async def fetch(
        self, ids: list[str], deadline: float | None = None
    ) -> tuple[list[list[float] | None], bool]:
        pipe = self.redis.client.pipeline(transaction=False)
        for i in ids:
            pipe.hmget(self.prefix + i, self.names)
        timeout = self.redis.admit(deadline)
        if timeout is None:  # bypassed, or no time left
            return [None] * len(ids), True
        try:
            replies = await self.redis.call(pipe.execute(), timeout)
        except Exception:  # down, slow, broken (logged by the breaker): the caller decides
            return [None] * len(ids), True
        rows: list[list[float] | None] = []
        for values in replies:
            if all(v is None for v in values):
                rows.append(None)
            else:
                rows.append([float(v) if v is not None else float("nan") for v in values])
        return rows, False

    async def close(self) -> None:
        await self.redis.close()


@dataclass
class FeatureSet:
    """A model's features: where the ids come from, what to fetch, and the tensor to build."""

    input: str  # the model input this assembles, FP32 [batch, len(names)]
    names: list[str]
    defaults: list[float]
    source: FeatureLookup
    entity_parameter: str | None = None  # an OIP request parameter (batch 1) ...
    entity_input: str | None = None  # ... or a BYTES input [batch] / [batch, 1] of ids
    on_unavailable: str = "defaults"  # or "fail"

    def __post_init__(self) -> None:
        self._defaults = np.asarray(self.defaults, dtype=np.float32)
        # a table's NaNs ("nan" in the file) take the defaults once, here, not per request
        self._clean = isinstance(self.source, TableFeatures) and self.source.fill_nan(self._defaults)

    @classmethod
    def from_config(
        cls,
        f: Features,
        model_inputs: set[str],
        model_dir: Path,
        redis_url: str,
        timeout_s: float,
        backoff_s: float,
    ) -> FeatureSet:
        """The feature set a model's ``features`` config declares; raises ConfigError."""
        if f.input not in model_inputs:
            raise ConfigError(f"features.input {f.input!r} is not an input of the model")
        names = list(f.names)
        source: TableFeatures | RedisFeatures
        if f.source.table is not None:
            source = TableFeatures(model_dir / f.source.table, f.source.key, names)
        else:
            source = RedisFeatures(redis_url, f.source.redis_prefix or "", names, timeout_s, backoff_s)
        return cls(
            input=f.input,
            names=names,
            defaults=[f.defaults.get(n, 0.0) for n in names],
            source=source,
            entity_parameter=f.entity_parameter,
            entity_input=f.entity_input,
            on_unavailable=f.on_unavailable,
        )

    async def close(self) -> None:
        """Release the source's connections (Redis); a table has none."""
        close = getattr(self.source, "close", None)
        if close is not None:
            await close()

    async def assemble(
        self, ids: list[str], deadline: float | None = None
    ) -> tuple[np.ndarray[Any, Any], dict[str, Any]]:
        """The [batch, n] tensor, defaults filled in, and what to tell the client about it.

        ``deadline`` (an absolute ``time.perf_counter()``, or None) bounds the fetch.
        Raises UnavailableError when the source is unavailable and the model says fail."""
        out, unknown, unavailable = await self.assemble_rows(ids, deadline)
        return out, self.notes(int(unknown.sum()), unavailable)

    async def assemble_rows(
        self, ids: list[str], deadline: float | None = None
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], bool]:
        """The [batch, n] tensor, defaults filled in; which rows were unknown; whether the
        source was unavailable (every row defaulted). For callers that tell several clients
        about their own rows (a pipeline's batch)."""
        take = getattr(self.source, "take", None)
        unavailable = False
        if take is not None:  # in memory: nothing to wait for, nothing unavailable
            out, unknown = take(ids, self._defaults)
            if self._clean:  # the table's NaNs were filled at load: nothing to repair
                return out, unknown, unavailable
        else:
            rows, unavailable = await self.source.fetch(ids, deadline)
            if unavailable and self.on_unavailable == "fail":
                raise UnavailableError(
                    "the feature store is unavailable and this model's features have no fallback"
                )
            out = np.empty((len(ids), len(self.names)), dtype=np.float32)
            unknown = np.zeros(len(ids), dtype=bool)
            for i, row in enumerate(rows):
                if row is None:
                    unknown[i] = True
                    out[i] = self.defaults
                else:
                    out[i] = row
        nan = np.isnan(out)  # a field missing from a Redis hash, a "nan" in a table
        if nan.any():
            out[nan] = np.broadcast_to(self._defaults, out.shape)[nan]
        return out, unknown, unavailable

    @staticmethod
    def notes(unknown: int, unavailable: bool) -> dict[str, Any]:
        """What a client is told when some of its rows got defaults."""
        if unavailable:
            return {"features_defaulted": "feature store unavailable"}
        if unknown:
            return {"features_defaulted": f"{unknown} unknown entit{'y' if unknown == 1 else 'ies'}"}
        return {}


def write_table_to_redis(path: Path, key: str, url: str, prefix: str, batch: int = 1000) -> int:
    """``milliserve features load``: HSET every row of the table as ``<prefix><id>``."""
    import redis

    columns, rows = load_table(path, key)
    fields = [c for c in columns if c != key]
    client = redis.Redis.from_url(url)
    written = 0
    pipe = client.pipeline(transaction=False)
    for entity, row in rows.items():
        pipe.hset(prefix + entity, mapping={c: row[columns.index(c)] for c in fields})
        written += 1
        if written % batch == 0:
            pipe.execute()
    pipe.execute()
    client.close()
    return written
