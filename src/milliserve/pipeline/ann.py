"""The ``ann`` step: the k nearest neighbours of each embedding in a prebuilt index.

Reads ``input`` (FP32 [batch, dim], e.g. an encoder's ``embedding``) and makes the
neighbours' ``ids`` (INT64 [batch, k]), ``scores`` (FP32 [batch, k], higher is nearer)
and stored ``texts`` (BYTES [batch, k]), whichever the config names. The index is loaded
with the pipeline (``pipeline/ann_index.py``); its dim must match the input's.

A request may ask for another k with the parameter ``k``: an integer from 1 to ``max_k``,
anything else is refused (InvalidInputError, HTTP 400).

Where it runs, by measurement (docs/benchmarks.md, "ann-choice": 20k MiniLM embeddings,
M=16, ef=64, a busy 2-vCPU machine): one row takes 0.11 ms (p99 0.18 ms) on the event
loop and 0.16 ms (p99 0.28 ms) through a hop to a thread and back. The hop adds about
60 µs whatever the size: half again for a typed query, 15% from four rows on, where the
search (0.4 ms and up) would hold the loop. So a request of up to ``OFFLOAD_ROWS`` rows
searches inline, and a larger batch goes off the loop (hnswlib lets go of the GIL), where
it delays only itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from milliserve.config.model_config import ModelConfig
from milliserve.config.step_config import Ann
from milliserve.errors import BackendError, ConfigError, InvalidInputError, MissingDependencyError
from milliserve.pipeline.ann_index import AnnIndex
from milliserve.protocol.types import InferTensor
from milliserve.road import Call, Offload, Tensors

__all__ = ["OFFLOAD_ROWS", "AnnStep", "tensor_dim"]

# A batch with more rows than this is searched off the event loop (0.3 ms of search and up).
OFFLOAD_ROWS = 2


def tensor_dim(config: ModelConfig, before: int, name: str, get_model: Any) -> int | None:
    """The last dimension of the tensor ``name`` as the pipeline's inputs or the model steps
    before step number ``before`` (0-based) declare it; None where it is variable or unknown."""
    dims: tuple[int, ...] | None = next((t.dims for t in config.input if t.name == name), None)
    steps = config.ensemble_scheduling.step[:before] if config.ensemble_scheduling else ()
    for s in steps:
        if s.model_name:
            model = get_model(s.model_name, "" if s.model_version < 0 else str(s.model_version))
            for out in model.config.output:
                if (s.output_map.get(out.name) if s.output_map else out.name) == name:
                    dims = out.dims
        elif s.python is not None and name in s.python.outputs:
            dims = None  # a custom function's output: its shape is its own business
    return dims[-1] if dims and dims[-1] > 0 else None


class AnnStep:
    """Searches ``config.index`` for the nearest neighbours of ``config.input``'s rows."""

    rowwise = True  # every row searched on its own

    def __init__(
        self,
        name: str,
        config: Ann,
        model_dir: Path,
        input_dim: int | None = None,
        offload: Offload | None = None,
    ) -> None:
        try:
            self.index = AnnIndex.load(model_dir / config.index)
        except ImportError as exc:
            raise MissingDependencyError(str(exc)) from None
        index = self.index
        if input_dim is not None and input_dim != index.dim:
            raise ConfigError(
                f"index {config.index} holds {index.dim}-d vectors but {config.input!r} is {input_dim}-d"
            )
        if config.max_k > index.count:
            raise ConfigError(
                f"ann max_k is {config.max_k} but index {config.index} holds {index.count} vectors"
            )
        self.name, self.stage, self.config = name, "ann", config
        self.input, self.k, self.max_k = config.input, config.k, config.max_k
        self.needs: tuple[str, ...] = (config.input,)
        self.makes: tuple[str, ...] = tuple(n for n in (config.ids, config.scores, config.texts) if n)
        self._offload = offload

    def _k(self, parameters: dict[str, Any]) -> int:
        if "k" not in parameters:
            return self.k
        k = parameters["k"]  # null is refused, not read as the default
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_k:
            raise InvalidInputError(
                f"parameter 'k' is {k!r}; this pipeline takes an integer from 1 to {self.max_k}"
            )
        return k

    def _search(self, x: np.ndarray[Any, Any], k: int) -> list[InferTensor]:
        rows, scores = self.index.search(x, k)
        c = self.config
        out = []
        if c.ids:
            ids = self.index.ids[rows]
            out.append(InferTensor(c.ids, "INT64", ids.shape, ids))
        if c.scores:
            out.append(InferTensor(c.scores, "FP32", scores.shape, scores))
        if c.texts:
            texts = self.index.texts(rows)
            out.append(InferTensor(c.texts, "BYTES", texts.shape, texts))
        return out

    async def run(self, tensors: Tensors, call: Call) -> None:
        k = self._k(call.request.parameters)
        x = np.asarray(tensors[self.input].data)
        if x.ndim != 2 or x.shape[1] != self.index.dim or x.dtype.kind != "f":
            raise BackendError(
                f"{self.name}: {self.input!r} is {x.dtype} {list(x.shape)}; the index takes "
                f"float [batch, {self.index.dim}]"
            )
        x = np.ascontiguousarray(x, dtype=np.float32)
        made: Any
        if len(x) > OFFLOAD_ROWS and self._offload is not None:
            made = await self._offload(self._search, x, k)
        else:
            made = self._search(x, k)
        for t in made:
            tensors[t.name] = t
