"""Fill in, or check, a model config against what the model file itself declares.

With no config file, inputs and outputs come from the model, and batching is
turned on when every input and output has a dynamic first dimension. A config
that names tensors is checked against the model, so a typo fails at load with
the tensor named instead of at the first request.
"""

from __future__ import annotations

from milliserve.backends.base import BackendInfo
from milliserve.config.model_config import DynamicBatching, ModelConfig, TensorConfig
from milliserve.errors import ConfigError
from milliserve.protocol.types import TensorSpec

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "complete_config"]

DEFAULT_MAX_BATCH_SIZE = 32


def _batchable(info: BackendInfo) -> bool:
    return all(s.dims and s.dims[0] == -1 for s in (*info.inputs, *info.outputs))


def _from_model(specs: tuple[TensorSpec, ...], strip_batch: bool) -> tuple[TensorConfig, ...]:
    return tuple(
        TensorConfig(name=s.name, data_type=s.datatype, dims=s.dims[1:] if strip_batch else s.dims)
        for s in specs
    )


def _check(
    where: str,
    section: str,
    declared: tuple[TensorConfig, ...],
    model: tuple[TensorSpec, ...],
    batching: bool,
    implicit: tuple[str, ...] = (),
) -> None:
    """``implicit``: inputs the server fills itself (a sequence model's control and state
    inputs): the config does not declare them."""
    by_name = {s.name: s for s in model}
    for t in declared:
        spec = by_name.get(t.name)
        if spec is None:
            raise ConfigError(
                f"{where}: field '{section}': {t.name!r} is not an {section} of the model "
                f"(the model has {sorted(by_name)})"
            )
        if t.data_type != spec.datatype:
            raise ConfigError(
                f"{where}: field '{section}.{t.name}.data_type': config says {t.data_type} but the "
                f"model has {spec.datatype}"
            )
        full = ((-1,) if batching else ()) + t.dims
        ok = len(full) == len(spec.dims) and all(
            m == -1 or c == m or (c == -1 and m == -1) for c, m in zip(full, spec.dims, strict=True)
        )
        if not ok:
            raise ConfigError(
                f"{where}: field '{section}.{t.name}.dims': config gives {list(full)} "
                f"(batch dimension included) but the model has {list(spec.dims)}"
            )
    if section == "input":
        missing = sorted(set(by_name) - {t.name for t in declared} - set(implicit))
        if missing:
            raise ConfigError(f"{where}: field 'input': the model also needs inputs {missing}")


def _check_implicit(
    where: str, implicit: tuple[TensorSpec, ...], model: tuple[TensorSpec, ...], batching: bool
) -> None:
    """The control and state inputs of ``sequence_batching`` exist in the model with their
    datatypes (their dims are the batcher's to fill)."""
    by_name = {s.name: s for s in model}
    for t in implicit:
        spec = by_name.get(t.name)
        if spec is None:
            raise ConfigError(
                f"{where}: field 'sequence_batching': {t.name!r} is not an input of the model "
                f"(the model has {sorted(by_name)})"
            )
        if t.datatype != spec.datatype:
            raise ConfigError(
                f"{where}: field 'sequence_batching': input {t.name!r} is {spec.datatype} in the "
                f"model but the config makes it {t.datatype}"
            )


def complete_config(config: ModelConfig | None, name: str, info: BackendInfo, where: str) -> ModelConfig:
    """Return the config to serve with: derived from the model, completed, or checked."""
    if config is None:
        batching = _batchable(info)
        return ModelConfig(
            name=name,
            platform=info.platform,
            max_batch_size=DEFAULT_MAX_BATCH_SIZE if batching else 0,
            input=_from_model(info.inputs, batching),
            output=_from_model(info.outputs, batching),
            dynamic_batching=DynamicBatching() if batching else None,
        )
    batching = config.max_batch_size > 0
    if batching and not _batchable(info):
        fixed = [s.name for s in (*info.inputs, *info.outputs) if not s.dims or s.dims[0] != -1]
        raise ConfigError(
            f"{where}: field 'max_batch_size': {config.max_batch_size} needs a dynamic first "
            f"dimension, but the model fixes it for {fixed}; set max_batch_size: 0"
        )
    updates: dict[str, object] = {}
    implicit: tuple[TensorSpec, ...] = ()
    if config.sequence_batching is not None:
        implicit = config.sequence_batching.implicit_inputs()
        _check_implicit(where, implicit, info.inputs, batching)
    names = tuple(t.name for t in implicit)
    if config.input:
        _check(where, "input", config.input, info.inputs, batching, names)
    else:
        updates["input"] = _from_model(tuple(s for s in info.inputs if s.name not in names), batching)
    if config.output:
        _check(where, "output", config.output, info.outputs, batching)
    else:
        updates["output"] = _from_model(info.outputs, batching)
    return config.model_copy(update=updates) if updates else config
