"""Per-model configuration: the schema, and loaders for ``config.yaml`` and Triton ``config.pbtxt``.

Both formats use Triton's field names and land in the same pydantic schema, so a
field that is unknown or has a wrong value fails with the file and the field
named. Nothing is silently ignored. Triton's JSON and protobuf forms of a config, as the
APIs return it, are in ``config/triton_json.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from google.protobuf import json_format, text_format
from pydantic import Field, ValidationError, field_validator, model_validator

from milliserve.config.sequence_batching import SequenceBatching
from milliserve.config.step_config import Ensembling, Features, TokenizerConfig
from milliserve.config.strict import Strict as _Strict
from milliserve.errors import ConfigError
from milliserve.protocol.datatypes import config_type_to_oip
from milliserve.protocol.proto import oip_pb2
from milliserve.protocol.types import TensorSpec

__all__ = [
    "RUNTIME_PARAMETERS",
    "DynamicBatching",
    "InstanceGroup",
    "ModelConfig",
    "QueuePolicy",
    "VersionPolicy",
    "WarmupSpec",
    "config_from_json",
    "config_path",
    "load_model_config",
]

CONFIG_FILES = ("config.yaml", "config.yml", "config.pbtxt")
# ``parameters`` that the runtime reads, whatever the backend (backends accept these too).
RUNTIME_PARAMETERS = frozenset(
    {
        "allow_nonfinite_inputs",
        "inline_execution",
        "pipeline_batching",
        # test-only stalls (runtime/stall.py)
        "test_stall_ms",
        "test_stall_probability",
        "test_stall_seed",
    }
)
# platform and backend are checked against the backend registry when a model loads


class TensorConfig(_Strict):
    name: str
    data_type: str
    dims: tuple[int, ...] = ()
    # Triton's ``optional``: a request may leave the input out (for a pipeline: the step that
    # reads it decides what then, e.g. token ids in place of the tokenizer's text)
    optional: bool = False

    @field_validator("data_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        return config_type_to_oip(v)

    @field_validator("dims")
    @classmethod
    def _dims(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d < -1 or d == 0 for d in v):
            raise ValueError(f"dims must be positive or -1 (variable), got {list(v)}")
        return v

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.data_type, self.dims)


class QueuePolicy(_Strict):
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: int = Field(0, ge=0)
    allow_timeout_override: bool = False
    max_queue_size: int = Field(0, ge=0)


class DynamicBatching(_Strict):
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = Field(0, ge=0)
    priority_levels: int = Field(0, ge=0)
    default_priority_level: int = Field(0, ge=0)
    default_queue_policy: QueuePolicy = QueuePolicy()
    # milliserve: tune the queue delay and batch cap online to keep queue + compute p99 under this
    target_p99_ms: float | None = Field(None, gt=0)

    @field_validator("target_p99_ms", mode="before")
    @classmethod
    def _unset(cls, v: Any) -> Any:
        return None if v in (0, 0.0) else v  # protobuf's default means "not set"

    @model_validator(mode="after")
    def _priorities(self) -> DynamicBatching:
        if self.priority_levels and not 1 <= self.default_priority_level <= self.priority_levels:
            raise ValueError(
                f"default_priority_level must be in 1..{self.priority_levels} "
                f"(priority_levels), got {self.default_priority_level}"
            )
        if not self.priority_levels and self.default_priority_level:
            raise ValueError("default_priority_level needs priority_levels > 0")
        if any(p < 1 for p in self.preferred_batch_size):
            raise ValueError(f"preferred_batch_size must be >= 1, got {self.preferred_batch_size}")
        return self


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(v: Any) -> int:
    """Bytes from an int or a string like ``64MiB``, ``512KB``, ``1GiB``."""
    if isinstance(v, int | float):
        return int(v)
    text = str(v).strip().upper().replace(" ", "")
    number = text.rstrip("KMGIB")
    unit = text[len(number) :]
    if not number or unit not in _SIZE_UNITS:
        raise ValueError(f"{v!r} is not a size like 67108864, 64MiB or 500MB")
    return int(float(number) * _SIZE_UNITS[unit])


class ResponseCache(_Strict):
    """``response_cache``: Triton's ``enable``, plus the TTL, byte bound and backend."""

    enable: bool = False
    ttl_s: float = Field(60.0, gt=0)
    max_bytes: int = Field(64 * 2**20, gt=0)
    backend: Literal["memory", "redis"] = "memory"

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        return parse_size(v)


class Budget(_Strict):
    """``budget``: the latency budget, its p99 target and its split across stages (ms); for
    generative models, the time to first token and between tokens (ms)."""

    p99_ms: float | None = Field(None, gt=0)
    stages: dict[str, float] = {}
    ttft_ms: float | None = Field(None, gt=0)
    itl_ms: float | None = Field(None, gt=0)

    @field_validator("p99_ms", "ttft_ms", "itl_ms", mode="before")
    @classmethod
    def _unset(cls, v: Any) -> Any:
        return None if v == 0 else v  # a proto double left out reads as 0

    @model_validator(mode="after")
    def _fits(self) -> Budget:
        if self.p99_ms is None and self.ttft_ms is None and self.itl_ms is None:
            raise ValueError("budget needs p99_ms, or ttft_ms / itl_ms for a generative model")
        unknown = sorted(set(self.stages) - set(BUDGET_STAGES))
        if unknown:
            raise ValueError(f"budget.stages {unknown} are not stages; use {list(BUDGET_STAGES)}")
        if any(v < 0 for v in self.stages.values()):
            raise ValueError("budget.stages must be >= 0 ms")
        total = sum(self.stages.values())
        if self.stages and self.p99_ms is None:
            raise ValueError("budget.stages split p99_ms: set p99_ms too")
        if self.p99_ms is not None and total > self.p99_ms + 1e-9:
            raise ValueError(f"budget.stages add up to {total:g} ms, more than p99_ms {self.p99_ms:g}")
        return self


BUDGET_STAGES = (
    "parse",
    "cache",
    "features",
    "preprocess",
    "queue",
    "infer",
    "ann",
    "postprocess",
    "serialize",
)


class InstanceGroup(_Strict):
    name: str = ""
    count: int = Field(1, ge=1)
    kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU"] = "KIND_CPU"
    gpus: tuple[int, ...] = ()


class _Latest(_Strict):
    num_versions: int = Field(1, ge=1)


class _Specific(_Strict):
    versions: tuple[int, ...]


class VersionPolicy(_Strict):
    latest: _Latest | None = None
    all: dict[str, Any] | None = None
    specific: _Specific | None = None

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        chosen = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise ValueError(f"give one of latest, all, specific; got {chosen}")
        if self.all:
            raise ValueError("'all' takes no fields")
        return self

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of ``available`` (ascending)."""
        ordered = sorted(available)
        if self.all is not None:
            return ordered
        if self.specific is not None:
            return [v for v in ordered if v in self.specific.versions]
        n = self.latest.num_versions if self.latest else 1
        return ordered[-n:]


class WarmupInput(_Strict):
    data_type: str
    dims: tuple[int, ...] = ()
    zero_data: bool = False
    random_data: bool = False

    @field_validator("data_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        return config_type_to_oip(v)

    @model_validator(mode="after")
    def _one_source(self) -> WarmupInput:
        if self.zero_data == self.random_data:
            raise ValueError("set exactly one of zero_data or random_data")
        return self


class WarmupSpec(_Strict):
    name: str = "warmup"
    batch_size: int = Field(1, ge=1)
    inputs: dict[str, WarmupInput]
    count: int = Field(1, ge=1)


class ModelConfig(_Strict):
    """A model's configuration, in Triton's vocabulary."""

    name: str
    platform: str = ""
    backend: str = ""
    version_policy: VersionPolicy = VersionPolicy()
    max_batch_size: int = Field(0, ge=0)
    input: tuple[TensorConfig, ...] = ()
    output: tuple[TensorConfig, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None  # stateful models (config/sequence_batching.py)
    instance_group: tuple[InstanceGroup, ...] = ()
    parameters: dict[str, str] = {}
    model_warmup: tuple[WarmupSpec, ...] = ()
    response_cache: ResponseCache | None = None
    budget: Budget | None = None
    features: Features | None = None  # milliserve's (pbtxt field 102)
    tokenizer: TokenizerConfig | None = None  # milliserve's (pbtxt field 103)
    ensemble_scheduling: Ensembling | None = None  # platform "ensemble": a pipeline of steps

    @field_validator("parameters", mode="before")
    @classmethod
    def _flatten_parameters(cls, v: Any) -> Any:
        # Triton writes parameters { key: "k" value: { string_value: "v" } }; YAML may write k: v.
        if not isinstance(v, dict):
            return v
        flat: dict[str, Any] = {}
        for k, x in v.items():
            if isinstance(x, dict) and set(x) == {"string_value"}:
                x = x["string_value"]
            if isinstance(x, bool):
                x = str(x).lower()
            elif isinstance(x, int | float):
                x = str(x)
            flat[k] = x
        return flat

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        for section in ("input", "output"):
            names = [t.name for t in getattr(self, section)]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{section} names must be unique, repeated: {dupes}")
        if (self.platform == "ensemble") != (self.ensemble_scheduling is not None):
            raise ValueError("platform 'ensemble' and ensemble_scheduling go together")
        if self.ensemble_scheduling is not None:
            if not self.input or not self.output:
                raise ValueError("an ensemble declares its input and output tensors")
            model_only = (
                "dynamic_batching",
                "sequence_batching",
                "features",
                "tokenizer",
                "backend",
                "instance_group",
                "model_warmup",
            )
            unused = [k for k in model_only if getattr(self, k)]  # all unset ones are falsy
            if unused:
                raise ValueError(
                    f"{unused} do not apply to an ensemble: set them on its models, or use steps"
                )
        sb = self.sequence_batching
        if sb is not None:
            if self.dynamic_batching is not None:
                raise ValueError("dynamic_batching and sequence_batching exclude each other: choose one")
            if self.response_cache is not None and self.response_cache.enable:
                raise ValueError("a sequence model's answers depend on its state: no response_cache")
            declared = {t.name for t in self.input}
            implicit = sorted(declared & {t.name for t in sb.implicit_inputs()})
            if implicit:
                raise ValueError(
                    f"inputs {implicit} are filled by the sequence batcher (control or state "
                    "inputs): leave them out of 'input'"
                )
        db = self.dynamic_batching
        if db is not None:
            if self.max_batch_size == 0:
                raise ValueError("dynamic_batching needs max_batch_size > 0")
            too_big = [p for p in db.preferred_batch_size if p > self.max_batch_size]
            if too_big:
                raise ValueError(
                    f"preferred_batch_size {too_big} exceeds max_batch_size {self.max_batch_size}"
                )
        return self

    # ---- derived views used by the runtime ----
    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.instance_group) or 1

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(t.spec() for t in self.input)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(t.spec() for t in self.output)

    def stage_budget_s(self, stage: str) -> float | None:
        """The budget's allocation to ``stage`` in seconds, or None when it has none."""
        ms = self.budget.stages.get(stage) if self.budget is not None else None
        return ms / 1000 if ms else None

    def flag(self, key: str) -> bool:
        """A boolean entry of ``parameters`` (``true``/``1``); ConfigError for anything else."""
        raw = self.parameters.get(key, "false").lower()
        if raw not in ("true", "false", "1", "0"):
            raise ConfigError(f"parameter {key!r} must be true or false, got {raw!r}")
        return raw in ("true", "1")


def _format_validation(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown or unsupported field"
        lines.append(f"{path}: field '{loc}': {msg}")
    return "; ".join(lines)


def _validate(path: Path, data: dict[str, Any], model_name: str) -> ModelConfig:
    data = dict(data)
    data.setdefault("name", model_name)
    try:
        cfg = ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(path, exc)) from None
    if cfg.name != model_name:
        raise ConfigError(
            f"{path}: field 'name': {cfg.name!r} does not match the model directory {model_name!r}"
        )
    return cfg


def _parse_pbtxt(path: Path, text: str) -> dict[str, Any]:
    msg = oip_pb2.ModelConfig()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        detail = str(exc).replace("milliserve.oip.v2.", "")
        if "has no field named" in detail:
            detail += " (not a field milliserve supports; see docs/configuration.md)"
        raise ConfigError(f"{path}: {detail}") from None
    data: dict[str, Any] = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return data


def config_from_json(text: str, model_name: str, where: str) -> ModelConfig:
    """A config given as Triton's JSON (a load request's ``config`` parameter, parsed as
    Triton does: protobuf's JSON mapping, so ``"max_batch_size": "16"`` is 16). ConfigError
    naming ``where`` and the field when it is not valid."""
    msg = oip_pb2.ModelConfig()
    try:
        json_format.Parse(text, msg)
    except json_format.ParseError as exc:
        detail = str(exc).replace("milliserve.oip.v2.", "").split("\n Available Fields", 1)[0]
        if "has no field named" in detail:
            detail += " (not a field milliserve supports; see docs/configuration.md)"
        raise ConfigError(f"{where}: {detail}") from None
    data: dict[str, Any] = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return _validate(Path(where), data, model_name)


def config_path(model_dir: Path) -> Path:
    """The model's config file, or the model directory when it has none (for error messages)."""
    return next((model_dir / n for n in CONFIG_FILES if (model_dir / n).is_file()), model_dir)


def load_model_config(model_dir: Path) -> ModelConfig | None:
    """Read ``config.yaml``/``config.yml``/``config.pbtxt`` from a model directory.

    Returns None when the directory has no config file (the backend then
    derives inputs and outputs from the model). Raises ConfigError naming the
    file and field when the config is invalid, or when there are two config files.
    """
    found = [model_dir / n for n in CONFIG_FILES if (model_dir / n).is_file()]
    if not found:
        return None
    if len(found) > 1:
        raise ConfigError(f"{model_dir}: found {[p.name for p in found]}; keep only one")
    path = found[0]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".pbtxt":
        data = _parse_pbtxt(path, text)
    else:
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    return _validate(path, data, model_dir.name)
