"""Validate a request against a model before it is queued, so that one bad request
can never fail the batch it would have ridden in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.config.model_config import ModelConfig
from milliserve.errors import InvalidInputError
from milliserve.protocol.types import InferRequest, TensorSpec

__all__ = ["ModelIO", "Signature", "model_io", "validate_request"]

# Requests with equal signatures can be concatenated along the batch dimension.
Signature = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class ModelIO:
    """What validation needs to know of a model. Dims exclude the batch dimension
    when ``max_batch_size`` > 0."""

    label: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    max_batch_size: int
    allow_nonfinite: bool = False
    # inputs a request may leave out (Triton's ``optional``)
    optional: frozenset[str] = frozenset()
    # name -> (datatype, dims after the batch dimension when every one is fixed, else None)
    # of the required inputs: lets a well-formed request skip the general shape check (it
    # runs on every request)
    fast: dict[str, tuple[str, tuple[int, ...] | None]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name, spec in self.inputs.items():
            if name in self.optional:
                continue
            fixed = spec.dims if self.max_batch_size > 0 and -1 not in spec.dims else None
            self.fast[name] = (spec.datatype, fixed)


def model_io(config: ModelConfig) -> ModelIO:
    """What validation needs, from a model's (or pipeline's) config."""
    return ModelIO(
        label=config.name,
        inputs={t.name: t.spec() for t in config.input},
        outputs={t.name: t.spec() for t in config.output},
        max_batch_size=config.max_batch_size,
        allow_nonfinite=config.flag("allow_nonfinite_inputs"),
        optional=frozenset(t.name for t in config.input if t.optional),
    )


def _expected(io: ModelIO, spec: TensorSpec) -> list[int]:
    return ([-1] if io.max_batch_size > 0 else []) + list(spec.dims)


def _shape_ok(shape: tuple[int, ...], dims: list[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _check_finite(name: str, arr: np.ndarray[Any, Any]) -> None:
    if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        bad = int(np.flatnonzero(~np.isfinite(arr.reshape(-1)))[0])
        value = arr.reshape(-1)[bad]
        raise InvalidInputError(
            f"input {name!r} contains {value} at flat index {bad}; non-finite values are "
            "rejected unless the model sets parameter allow_nonfinite_inputs=true"
        )


def validate_request(request: InferRequest, io: ModelIO) -> tuple[int, Signature]:
    """Check names, datatypes, shapes, values and requested outputs.

    Returns the request's batch size (1 for models that do not batch) and its
    batching signature. Raises InvalidInputError naming the offending input.
    """
    fast = io.fast
    inputs = request.inputs
    if len(inputs) == len(fast) and not request.outputs:
        # the common case, checked in a few comparisons per input: every input given once,
        # fixed dims after the batch, one batch size. Anything else takes the general path
        # below, which names the problem.
        batch = 0
        for tensor in inputs:
            known = fast.get(tensor.name)
            shape = tensor.shape
            if (
                known is None
                or known[1] is None
                or tensor.datatype != known[0]
                or not shape
                or shape[1:] != known[1]
                or (batch and shape[0] != batch)
            ):
                break
            batch = shape[0]
        else:
            if 1 <= batch <= io.max_batch_size and (
                len(inputs) == 1 or len({t.name for t in inputs}) == len(inputs)
            ):
                if not io.allow_nonfinite:
                    for tensor in inputs:
                        if not tensor.finite:
                            _check_finite(tensor.name, tensor.data)
                if len(inputs) == 1:
                    return batch, ((inputs[0].name, inputs[0].shape[1:]),)
                return batch, tuple(sorted((t.name, t.shape[1:]) for t in inputs))
    seen: set[str] = set()
    found: int | None = None
    for tensor in request.inputs:
        spec = io.inputs.get(tensor.name)
        if spec is None:
            raise InvalidInputError(
                f"input {tensor.name!r} is not an input of model {io.label!r} (expected {sorted(io.inputs)})"
            )
        if tensor.name in seen:
            raise InvalidInputError(f"input {tensor.name!r} is given twice")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise InvalidInputError(
                f"input {tensor.name!r} has datatype {tensor.datatype} but model {io.label!r} "
                f"expects {spec.datatype}"
            )
        expected = _expected(io, spec)
        if not _shape_ok(tensor.shape, expected):
            raise InvalidInputError(
                f"input {tensor.name!r} has shape {list(tensor.shape)} but model {io.label!r} "
                f"expects {expected}"
            )
        if io.max_batch_size > 0:
            b = tensor.shape[0]
            if b < 1 or b > io.max_batch_size:
                raise InvalidInputError(
                    f"input {tensor.name!r} has batch size {b} but model {io.label!r} takes "
                    f"1..{io.max_batch_size} (max_batch_size)"
                )
            if found is not None and b != found:
                raise InvalidInputError(
                    f"input {tensor.name!r} has batch size {b} but other inputs have {found}"
                )
            found = b
        if not io.allow_nonfinite and not tensor.finite:
            _check_finite(tensor.name, tensor.data)
    missing = sorted(set(io.inputs) - seen - io.optional)
    if missing:
        raise InvalidInputError(f"model {io.label!r} needs inputs {missing}, which the request lacks")
    if request.outputs:
        for out in request.outputs:
            if out.name not in io.outputs:
                raise InvalidInputError(
                    f"requested output {out.name!r} is not an output of model {io.label!r} "
                    f"(expected {sorted(io.outputs)})"
                )
    signature = tuple(sorted((t.name, t.shape[1:]) for t in request.inputs))
    return (found or 1), signature
