"""Transport-free Open Inference Protocol types.

These are plain slotted dataclasses: they sit on the hot path, so they carry
numpy arrays and no validation of their own. Validation against a model lives
in runtime/validation.py; decoding from the wire lives in the codecs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "InferRequest",
    "InferResponse",
    "InferTensor",
    "Parameters",
    "RequestedOutput",
    "SharedMemoryInput",
    "TensorSpec",
]

Parameters = dict[str, Any]
# The front end's reader of an input held in shared memory: (name, datatype, shape, the
# input's parameters naming the region) -> the tensor (a view of the mapping). Codecs call
# it for inputs with ``shared_memory_region``; None when shared memory is off.
SharedMemoryInput = Callable[[str, str, tuple[int, ...], Parameters], np.ndarray[Any, Any]]


@dataclass(slots=True)
class InferTensor:
    """A named tensor. ``data`` has the numpy dtype of ``datatype`` and shape ``shape``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]
    parameters: Parameters = field(default_factory=dict)
    # every value is known to be finite (decoded from JSON, which has no NaN or infinity):
    # validation need not look (runtime/validation.py)
    finite: bool = False


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (e.g. ``binary_data``)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request as the dataplane sees it, whatever the transport."""

    model_name: str
    model_version: str
    inputs: list[InferTensor]
    id: str = ""
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)
    # absolute time.perf_counter() by which the answer must be out: from the HTTP header
    # x-request-deadline-ms or the gRPC deadline (set by the front-ends)
    deadline: float | None = None
    # where the road records the request's spans (a milliserve.road.SpanLog) when the server
    # traces (observability/tracing.py); None: not traced, the plain road
    trace: Any = None
    # the client connection it came on (set by the front-ends; any hashable): the batcher's
    # queue takes turns between clients and refuses the one holding the most when full
    client: Any = None


@dataclass(slots=True)
class InferResponse:
    """The answer to one InferRequest."""

    model_name: str
    model_version: str
    outputs: list[InferTensor]
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    # seconds per request stage (parse, cache, queue, infer, serialize, ...): not sent as
    # tensors; front-ends turn them into Server-Timing / trailing metadata
    timings: dict[str, float] = field(default_factory=dict)
    # where a front-end reports the stages it timed itself (decode, serialize)
    record_stages: Any = None


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model input or output as declared: name, OIP datatype and dims (-1 = variable).

    ``dims`` excludes the batch dimension when the model batches (max_batch_size > 0),
    as in Triton's config.
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
