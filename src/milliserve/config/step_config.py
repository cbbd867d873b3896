"""Config of the steps around a model: online features, the tokenizer, and a pipeline's
``ensemble_scheduling`` (model steps in Triton's fields, plus rules and Python steps).
Part of the model config schema (model_config.py), in YAML or pbtxt."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from milliserve.config.strict import Strict

__all__ = [
    "STEP_KINDS",
    "Ann",
    "Cascade",
    "Ensembling",
    "FeatureSource",
    "Features",
    "Hedge",
    "PipelineStep",
    "Pooling",
    "PythonStep",
    "RuleThreshold",
    "Rules",
    "Score",
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
    # false: an empty (or whitespace-only) text is refused with 400 instead of tokenized to
    # the special tokens alone (a search for nothing)
    allow_empty: bool = True
    # a second BYTES input: each row is the pair (text_input, pair_input), as a cross-encoder
    # reads a query and a document; over max_length the pair's second text is cut first
    pair_input: str | None = None
    # model input for the token type ids (0 on the first text, 1 on the second; None: none)
    type_ids: str | None = None

    @field_validator("overflow", mode="before")
    @classmethod
    def _default_overflow(cls, v: object) -> object:
        return v or "truncate"  # protobuf's empty string means "not set"

    @field_validator("pair_input", "type_ids", mode="before")
    @classmethod
    def _unset_name(cls, v: object) -> object:
        return v or None  # protobuf's empty string means "not set"

    @model_validator(mode="after")
    def _distinct(self) -> TokenizerConfig:
        made = [n for n in (self.ids, self.mask, self.type_ids) if n]
        read = [n for n in (self.text_input, self.pair_input) if n]
        if len(set(made + read)) != len(made + read):
            raise ValueError(f"tokenizer reads {read} and makes {made}: every name must differ")
        return self

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


class Ann(Strict):
    """An ``ann`` step: the ``k`` nearest neighbours of each row of ``input`` (FP32 [batch,
    dim]) in a prebuilt index (``milliserve index build``; ``index`` is relative to the model
    directory). Makes ``ids`` (INT64 [batch, k]), ``scores`` (FP32 [batch, k], higher is
    nearer) and ``texts`` (BYTES [batch, k], the stored texts); each names its output tensor,
    None leaves it out. A request may ask for another k with the parameter ``k``, 1 to
    ``max_k`` (pipeline/ann.py)."""

    index: str
    input: str = "embedding"
    k: int = Field(10, ge=1)
    max_k: int = Field(100, ge=1)
    ids: str | None = "ids"
    scores: str | None = "scores"
    texts: str | None = None

    @field_validator("k", "max_k", mode="before")
    @classmethod
    def _unset_number(cls, v: object, info: ValidationInfo) -> object:
        if v == 0:  # protobuf's default means "not set"
            assert info.field_name is not None
            return cls.model_fields[info.field_name].default
        return v

    @field_validator("input", "ids", "scores", "texts", mode="before")
    @classmethod
    def _unset_name(cls, v: object, info: ValidationInfo) -> object:
        if v == "":  # protobuf's empty string means "not set"
            assert info.field_name is not None
            return cls.model_fields[info.field_name].default
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Ann:
        if self.k > self.max_k:
            raise ValueError(f"ann.k is {self.k} but ann.max_k is {self.max_k}")
        made = [n for n in (self.ids, self.scores, self.texts) if n]
        if not made:
            raise ValueError("ann makes nothing: name at least one of ids, scores, texts")
        if len(set(made)) != len(made):
            raise ValueError(f"ann outputs must have distinct names, got {made}")
        return self


class Pooling(Strict):
    """A ``pooling`` step: one vector per text from a model's token embeddings ``input``
    (FP32 [batch, seq, dim]) and the tokenizer's attention ``mask`` (INT64 [batch, seq]), as a
    sentence-transformers model folder declares it: ``mode`` mean (over the attended tokens),
    cls (the first attended token), last_token (the last attended one) or none (``input`` is
    already one vector per text, [batch, dim]); then L2 ``normalize``. Makes ``output`` (FP32
    [batch, dim]) and ``tokens`` (INT64 [batch, 1], the tokens each text had, the usage count;
    None: not made). A request may ask for a smaller vector with the parameter ``dimensions``
    when it is one of ``dimensions`` (a Matryoshka model's sizes): the vector is cut to it,
    then normalised again (pipeline/pooling.py). ``int8_scale`` is the scale of the int8
    and uint8 embeddings ``/v1/embeddings`` may return (runtime/embedding_types.py)."""

    input: str = "token_embeddings"
    mask: str = "attention_mask"
    mode: Literal["mean", "cls", "last_token", "none"] = "mean"
    normalize: bool = True
    output: str = "embedding"
    tokens: str | None = "tokens"
    dimensions: tuple[int, ...] = ()
    # /v1/embeddings' int8 and uint8 types: the largest magnitude of a component (calibrated
    # on the model's embeddings of real texts), mapped to 127; None: 1.0 when normalize is
    # on (unit vectors' components stay within -1..1), else those types are refused
    int8_scale: float | None = Field(None, gt=0)

    @field_validator("input", "mask", "mode", "output", "tokens", mode="before")
    @classmethod
    def _unset(cls, v: object, info: ValidationInfo) -> object:
        if v == "":  # protobuf's empty string means "not set"
            assert info.field_name is not None
            return cls.model_fields[info.field_name].default
        return v

    @field_validator("int8_scale", mode="before")
    @classmethod
    def _unset_scale(cls, v: object) -> object:
        return None if v == 0 else v  # protobuf's default means "not set"

    @field_validator("dimensions")
    @classmethod
    def _sizes(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d < 1 for d in v) or len(set(v)) != len(v):
            raise ValueError(f"pooling.dimensions must be distinct positive sizes, got {list(v)}")
        return tuple(sorted(v, reverse=True))

    @model_validator(mode="after")
    def _distinct(self) -> Pooling:
        made = [n for n in (self.output, self.tokens) if n]
        if len(set(made)) != len(made) or self.input in made or self.mask in made:
            raise ValueError(
                f"pooling reads {self.input!r} and {self.mask!r} and makes {made}: every name must differ"
            )
        return self


class Score(Strict):
    """A ``score`` step: a model's scores made what clients get, in numpy on the whole batch:
    ``activation`` sigmoid (a cross-encoder's relevance logit to 0..1), softmax (a
    classifier's logits to probabilities, over the last axis) or none. ``input`` is FP32
    [batch, n] or [batch]; ``output`` (FP32 [batch, n]) holds the result. A request with the
    parameter ``raw_scores`` true gets ``input`` as it is. ``tokens`` (INT64 [batch, 1]: the
    attended tokens of ``mask`` per row, the usage count; None: not made) as pooling makes
    them (pipeline/score.py)."""

    input: str = "logits"
    activation: Literal["sigmoid", "softmax", "none"] = "sigmoid"
    output: str = "score"
    mask: str = "attention_mask"
    tokens: str | None = "tokens"

    @field_validator("input", "activation", "output", "mask", "tokens", mode="before")
    @classmethod
    def _unset(cls, v: object, info: ValidationInfo) -> object:
        if v == "":  # protobuf's empty string means "not set"
            assert info.field_name is not None
            return cls.model_fields[info.field_name].default
        return v

    @model_validator(mode="after")
    def _distinct(self) -> Score:
        made = [n for n in (self.output, self.tokens) if n]
        if len(set(made)) != len(made) or self.input in made or self.mask in made:
            raise ValueError(
                f"score reads {self.input!r} and {self.mask!r} and makes {made}: every name must differ"
            )
        return self


class Hedge(Strict):
    """``hedge`` on a model step: send the request to the least busy of ``model_name`` and
    ``replicas`` and, when it has not answered within ``after_ms`` (0: the step's measured
    p95), a copy to another replica, up to ``max_extra`` copies; the first answer wins and
    the others are cancelled. No copy goes to a replica with ``max_queue`` requests queued,
    nor while the step has ``max_inflight`` requests in flight (pipeline/hedge.py)."""

    replicas: tuple[str, ...]
    after_ms: float = Field(0.0, ge=0)
    max_extra: int = Field(1, ge=1)
    max_queue: int = Field(4, ge=1)
    max_inflight: int = Field(32, ge=1)

    @field_validator("max_extra", "max_queue", "max_inflight", mode="before")
    @classmethod
    def _unset(cls, v: object, info: ValidationInfo) -> object:
        if v == 0:  # protobuf's default means "not set"
            assert info.field_name is not None
            return cls.model_fields[info.field_name].default
        return v

    @model_validator(mode="after")
    def _replicas(self) -> Hedge:
        if not self.replicas or len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"hedge.replicas must name distinct models, got {list(self.replicas)}")
        if self.max_extra > len(self.replicas):
            raise ValueError(
                f"hedge.max_extra is {self.max_extra} but hedge.replicas names {len(self.replicas)}"
            )
        return self


class Cascade(Strict):
    """A cascade step: ``fast`` answers every row; the rows whose top probability (the row's
    largest value of the output ``probabilities``) is under ``escalate_below`` go to ``full``
    in one request. Both models have the same inputs and outputs; ``answered_by`` names an
    optional BYTES output [batch, 1] saying which model answered each row
    (pipeline/cascade.py)."""

    fast: str
    full: str
    escalate_below: float = Field(gt=0, le=1)
    probabilities: str = "probabilities"
    answered_by: str | None = None

    @field_validator("probabilities", "answered_by", mode="before")
    @classmethod
    def _unset(cls, v: object, info: ValidationInfo) -> object:
        if v == "":  # protobuf's empty string means "not set"
            return "probabilities" if info.field_name == "probabilities" else None
        return v

    @model_validator(mode="after")
    def _two(self) -> Cascade:
        if self.fast == self.full:
            raise ValueError(f"cascade.fast and cascade.full are both {self.fast!r}")
        return self


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
    ann: Ann | None = None
    pooling: Pooling | None = None
    score: Score | None = None
    cascade: Cascade | None = None
    hedge: Hedge | None = None  # on a model step: hedged requests over replicas

    @model_validator(mode="after")
    def _one(self) -> PipelineStep:
        kinds = [k for k in STEP_KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"a step needs exactly one of {list(STEP_KINDS)}, got {kinds or 'none'}")
        if kinds[0] not in ("model_name", "cascade") and (self.input_map or self.output_map):
            raise ValueError("input_map and output_map belong to model steps (and cascades)")
        if self.hedge is not None:
            if kinds[0] != "model_name":
                raise ValueError("hedge belongs to model steps")
            if self.model_name in self.hedge.replicas:
                raise ValueError(f"hedge.replicas names the step's own model {self.model_name!r}")
        return self

    @property
    def models(self) -> tuple[str, ...]:
        """The models of the repository this step calls."""
        if self.cascade is not None:
            return (self.cascade.fast, self.cascade.full)
        if not self.model_name:
            return ()
        return (self.model_name, *(self.hedge.replicas if self.hedge is not None else ()))

    def roles(self) -> tuple[tuple[str, str], ...]:
        """(model, what it is to this step, "" for a plain model step) for the models this
        step calls, for messages."""
        if self.cascade is not None:
            return ((self.cascade.fast, "cascade fast model"), (self.cascade.full, "cascade full model"))
        if not self.model_name:
            return ()
        replicas = self.hedge.replicas if self.hedge is not None else ()
        return ((self.model_name, ""), *((m, f"hedge replica of {self.model_name!r}") for m in replicas))

    @property
    def kind(self) -> str:
        return "model" if self.model_name else next(k for k in STEP_KINDS[1:] if getattr(self, k))


STEP_KINDS = (
    "model_name",
    "tokenizer",
    "features",
    "rules",
    "python",
    "cascade",
    "ann",
    "pooling",
    "score",
)


class Ensembling(Strict):
    step: tuple[PipelineStep, ...]
