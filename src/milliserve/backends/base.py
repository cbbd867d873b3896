"""The backend protocol. Backends are blocking, synchronous code: the executor runs
them off the event loop, and they know nothing of asyncio."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from milliserve.protocol.types import TensorSpec

__all__ = ["Backend", "BackendInfo"]


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
