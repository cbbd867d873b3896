"""Config of the steps around a model: online features, the tokenizer, and a pipeline's
``ensemble_scheduling`` (model steps in Triton's fields, plus rules and Python steps).
Part of the model config schema (model_config.py), in YAML or pbtxt."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from milliserve.config.base import Strict

__all__ = [
    "STEP_KINDS",
    "Ensembling",
    "FeatureSource",
    "Features",
    "PipelineStep",
    "PythonStep",
    "RuleThreshold",
    "Rules",
    "TokenizerConfig",
]


class FeatureSource(Strict):
    """Where features come from: a table (CSV or Parquet, relative to the model directory)
    keyed by ``key``, or Redis hashes ``<redis_prefix><id>``."""

    table: str | None = None
    key: str = "id"
    redis_prefix: str | None = None

    @model_validator(mode="after")
    def _one(self) -> FeatureSource:
        if (self.table is None) == (self.redis_prefix is None):
            raise ValueError("features.source needs exactly one of table or redis_prefix")
        return self


class Features(Strict):
    """``features`` (config.yaml): fetch rows by entity id and build the input ``input``
    (FP32 [batch, len(names)]) before the model runs."""

    input: str
    names: tuple[str, ...]
    source: FeatureSource
    defaults: dict[str, float] = {}
    entity_parameter: str | None = None
    entity_input: str | None = None
    on_unavailable: Literal["defaults", "fail"] = "defaults"

    @model_validator(mode="after")
    def _consistent(self) -> Features:
        if (self.entity_parameter is None) == (self.entity_input is None):
            raise ValueError("features needs exactly one of entity_parameter or entity_input")
        unknown = sorted(set(self.defaults) - set(self.names))
        if unknown:
            raise ValueError(f"features.defaults names {unknown}, which are not in features.names")
        if not self.names:
            raise ValueError("features.names is empty")
        return self


class TokenizerConfig(Strict):
    """``tokenizer`` (config.yaml): raw text in, token ids out, before the model runs."""

    file: str  # tokenizer.json, relative to the model directory
    text_input: str = "TEXT"  # the BYTES input clients send
    ids: str = "input_ids"  # model input for the token ids
    mask: str | None = "attention_mask"  # model input for the attention mask (None: none)
    max_length: int = Field(128, ge=1)
    # a text longer than max_length tokens: cut to max_length ("truncate") or refused with 400
    overflow: Literal["truncate", "refuse"] = "truncate"
    # one text's size limit in UTF-8 bytes, checked before tokenizing (0: 64 bytes per token
    # of max_length; no WordPiece token of a real text comes near that)
    max_text_bytes: int = Field(0, ge=0)

    @field_validator("overflow", mode="before")
    @classmethod
    def _default_overflow(cls, v: object) -> object:
        return v or "truncate"  # protobuf's empty string means "not set"

    @property
    def text_limit(self) -> int:
        return self.max_text_bytes or 64 * self.max_length


class RuleThreshold(Strict):
    at_least: float
    label: str


class Rules(Strict):
    """A business-rules step: a score mapped to a label. ``thresholds`` (checked in order,
    the first ``at_least`` the score reaches wins, else ``default``) threshold one column of
    ``input``; ``labels`` name the columns instead and the largest one wins."""

    input: str
    output: str
    column: int = Field(0, ge=0)
    thresholds: tuple[RuleThreshold, ...] = ()
    default: str = ""
    labels: tuple[str, ...] = ()
    score_output: str | None = None  # also return the score the label was chosen on

    @model_validator(mode="after")
    def _one(self) -> Rules:
        if bool(self.thresholds) == bool(self.labels):
            raise ValueError("rules needs exactly one of thresholds or labels")
        if self.thresholds and not self.default:
            raise ValueError("rules.thresholds needs a default label for scores below every threshold")
        return self


class PythonStep(Strict):
    """A custom step: ``function`` (``package.module:function``) is called with a dict of the
    named ``inputs`` (numpy arrays) and ``parameters``, and returns a dict with ``outputs``."""

    function: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    parameters: dict[str, str] = {}

    @field_validator("function")
    @classmethod
    def _form(cls, v: str) -> str:
        module, _, attr = v.partition(":")
        if not module or not attr:
            raise ValueError(f"function must be 'package.module:function', got {v!r}")
        return v


class PipelineStep(Strict):
    """One step of ``ensemble_scheduling``: a model of the repository (Triton's fields), or
    one of milliserve's built-in steps, or a custom Python function."""

    model_name: str = ""
    model_version: int = -1
    input_map: dict[str, str] = {}  # model input -> pipeline tensor
    output_map: dict[str, str] = {}  # model output -> pipeline tensor
    tokenizer: TokenizerConfig | None = None
    features: Features | None = None
    rules: Rules | None = None
    python: PythonStep | None = None

    @model_validator(mode="after")
    def _one(self) -> PipelineStep:
        kinds = [k for k in STEP_KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"a step needs exactly one of {list(STEP_KINDS)}, got {kinds or 'none'}")
        if kinds[0] != "model_name" and (self.input_map or self.output_map):
            raise ValueError("input_map and output_map belong to model steps")
        return self

    @property
    def kind(self) -> str:
        return "model" if self.model_name else next(k for k in STEP_KINDS[1:] if getattr(self, k))


STEP_KINDS = ("model_name", "tokenizer", "features", "rules", "python")


class Ensembling(Strict):
    step: tuple[PipelineStep, ...]
