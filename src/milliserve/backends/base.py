"""The backend protocol. Backends are blocking, synchronous code: the executor runs
them off the event loop, and they know nothing of asyncio."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from milliserve.protocol.types import TensorSpec

__all__ = ["Backend", "BackendInfo", "GenerativeBackendFactory"]


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a loaded backend tells about itself. Tensor dims include the batch
    dimension as the model declares it (-1 when dynamic)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    platform: str
    # Human-readable notes, e.g. an execution provider that was requested but is missing.
    notes: tuple[str, ...] = field(default=())


class Backend(Protocol):
    """One model instance. ``run`` may be called from a worker thread; one call at a time."""

    def info(self) -> BackendInfo: ...

    def run(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str]
    ) -> dict[str, np.ndarray[Any, Any]]: ...

    def close(self) -> None: ...


class GenerativeBackendFactory(ABC):
    """An engine for generative models (``backends/llama_cpp.py``): the registry builds a
    ``GenerativeServable`` around the token model ``load_model`` returns (the operations
    ``llm.token_model.TokenModel`` declares), where a tensor backend's factory creates
    ``Backend`` instances. ``load_model`` blocks; the servable runs it off the event loop."""

    name: str  # the config's ``backend``
    platforms: tuple[str, ...]  # the config ``platform`` values it serves
    model_filename: str  # the file it loads from a version folder

    @abstractmethod
    def options(self, config: Any) -> Any:
        """Parse the config's ``parameters``; raises ConfigError naming the parameter."""

    @abstractmethod
    def load_model(self, model_path: Path, options: Any, n_seq: int) -> Any:
        """The model with a context of ``n_seq`` sequences (a ``TokenModel``)."""
