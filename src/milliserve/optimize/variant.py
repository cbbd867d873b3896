"""What a variant builder produces: a model file and how to run it, or why it was skipped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.optimize.measure import ModelRef

__all__ = ["Feeds", "Scorer", "SearchStep", "Skip", "Variant"]

Feeds = dict[str, np.ndarray[Any, Any]]
# The quality of a candidate model file on EVAL (accuracy or cosine); used by the searches.
Scorer = Callable[[Path | ModelRef], float]


@dataclass
class SearchStep:
    """One measured step of an accuracy-aware search, for the report."""

    what: str
    kept_fp32: int  # nodes kept in FP32 at this step
    quality: float
    seconds: float


@dataclass
class Variant:
    name: str
    path: Path | None
    note: str = ""
    skipped: str = ""  # why it was not built
    runtime: str = "onnxruntime"  # or "openvino" / "torch_compile": how measure/predict run it
    precision: str = ""  # OpenVINO inference precision hint, pinned
    module: Any = None  # torch_compile: the TorchModel
    search: list[SearchStep] = field(default_factory=list)  # accuracy-aware search, if one ran

    @property
    def ref(self) -> ModelRef:
        assert self.path is not None, f"{self.name} was not built"
        return ModelRef(self.path, self.runtime, self.precision, self.module)

    @property
    def servable(self) -> bool:
        """``milliserve serve`` has a backend for it (torch.compile rows are references)."""
        return self.runtime in ("onnxruntime", "openvino")


class Skip(Exception):
    """The variant does not apply to this model; the message says why."""
