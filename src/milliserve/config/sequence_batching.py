"""``sequence_batching``: Triton's schema for stateful models (the sequence batcher).

A model with this section is served by the sequence batcher (runtime/sequence_scheduler.py): the
requests of one sequence (one correlation id) run in order, one at a time, on one model
instance, and the batcher feeds the model the control inputs it declares (start, end,
ready, correlation id) and, for implicit state, the state output of the sequence's previous
request. Field names, defaults and meanings are Triton's (model_config.proto,
docs/user_guide/model_execution.md and implicit_state_management.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from milliserve.config.strict import Strict
from milliserve.protocol.datatypes import BYTES, config_type_to_oip, oip_to_config_type
from milliserve.protocol.types import TensorSpec

__all__ = [
    "CORRID_TYPES",
    "DEFAULT_IDLE_US",
    "ControlInput",
    "InitialState",
    "ResolvedControl",
    "SequenceBatching",
    "SequenceControl",
    "SequenceState",
]

# Triton's default for max_sequence_idle_microseconds (0 in the config means this)
DEFAULT_IDLE_US = 1_000_000
CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", BYTES)
Kind = Literal[
    "CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_CORRID"
]


class SequenceControl(Strict):
    """One control signal: ``kind`` (protobuf's default, 0, is START) and how it is spelled:
    ``int32_false_true``, ``fp32_false_true`` or ``bool_false_true`` for the flags, a
    ``data_type`` for the correlation id."""

    kind: Kind = "CONTROL_SEQUENCE_START"
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()
    data_type: str = ""

    @field_validator("data_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        return config_type_to_oip(v) if v else v

    @model_validator(mode="after")
    def _spelled_once(self) -> SequenceControl:
        spellings = [
            (name, values)
            for name, values in (
                ("int32_false_true", self.int32_false_true),
                ("fp32_false_true", self.fp32_false_true),
                ("bool_false_true", self.bool_false_true),
            )
            if values
        ]
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if spellings:
                raise ValueError(f"CONTROL_SEQUENCE_CORRID takes a data_type, not {spellings[0][0]}")
            if self.data_type not in CORRID_TYPES:
                raise ValueError(
                    "CONTROL_SEQUENCE_CORRID needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                    f"TYPE_INT32 or TYPE_STRING, got {self.data_type or 'none'!r}"
                )
            return self
        if self.data_type:
            raise ValueError(f"{self.kind} takes int32/fp32/bool_false_true, not a data_type")
        if len(spellings) != 1 or len(spellings[0][1]) != 2:
            raise ValueError(
                f"{self.kind} needs exactly one of int32_false_true, fp32_false_true or "
                "bool_false_true, with two values (false, true)"
            )
        return self

    def resolved(self, name: str) -> ResolvedControl:
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            return ResolvedControl(name, self.kind, self.data_type, None, None)
        if self.int32_false_true:
            f, t = self.int32_false_true
            return ResolvedControl(name, self.kind, "INT32", f, t)
        if self.fp32_false_true:
            ff, tf = self.fp32_false_true
            return ResolvedControl(name, self.kind, "FP32", ff, tf)
        fb, tb = self.bool_false_true
        return ResolvedControl(name, self.kind, "BOOL", fb, tb)


class ResolvedControl:
    """A control input as the batcher fills it: the input's name, the signal, its datatype
    and the values for false and true (None for the correlation id)."""

    __slots__ = ("datatype", "false", "kind", "name", "true")

    def __init__(self, name: str, kind: str, datatype: str, false: Any, true: Any) -> None:
        self.name, self.kind, self.datatype, self.false, self.true = name, kind, datatype, false, true


class ControlInput(Strict):
    name: str
    control: tuple[SequenceControl, ...]

    @model_validator(mode="after")
    def _one(self) -> ControlInput:
        if len(self.control) != 1:
            raise ValueError(
                f"control_input {self.name!r} needs exactly one control, got {len(self.control)}"
            )
        return self


class InitialState(Strict):
    """The state a sequence starts from: zeros, or the raw row-major contents of
    ``<model>/initial_state/<data_file>``."""

    data_type: str
    dims: tuple[int, ...] = ()
    zero_data: bool = False
    data_file: str = ""
    name: str = ""

    @field_validator("data_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        return config_type_to_oip(v)

    @model_validator(mode="after")
    def _one_source(self) -> InitialState:
        if self.zero_data == bool(self.data_file):
            raise ValueError("initial_state needs exactly one of zero_data or data_file")
        if any(d < 1 for d in self.dims):
            raise ValueError(f"initial_state dims must be fixed positive sizes, got {list(self.dims)}")
        if self.data_file and ("/" in self.data_file or self.data_file.startswith(".")):
            raise ValueError(f"initial_state data_file {self.data_file!r} must be a plain file name")
        return self


class SequenceState(Strict):
    """Implicit state: the model's ``output_name`` after one request of a sequence is fed
    back as ``input_name`` to the next; the server keeps it per sequence."""

    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...] = ()
    initial_state: tuple[InitialState, ...] = ()
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False

    @field_validator("data_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        return config_type_to_oip(v)

    @model_validator(mode="after")
    def _shape(self) -> SequenceState:
        if any(d < -1 or d == 0 for d in self.dims):
            raise ValueError(f"state dims must be positive or -1, got {list(self.dims)}")
        if len(self.initial_state) > 1:
            raise ValueError(f"state {self.input_name!r}: at most one initial_state")
        return self

    def start_dims(self) -> tuple[int, ...]:
        """Dims of the state a sequence starts with: the initial state's, or the state's with
        1 for each variable dimension (as Triton)."""
        if self.initial_state:
            return self.initial_state[0].dims
        return tuple(1 if d == -1 else d for d in self.dims)


class StrategyDirect(Strict):
    max_queue_delay_microseconds: int = Field(0, ge=0)
    minimum_slot_utilization: float = Field(0.0, ge=0.0, le=1.0)


class StrategyOldest(Strict):
    max_candidate_sequences: int = Field(0, ge=0)
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = Field(0, ge=0)
    preserve_ordering: bool = False


class SequenceBatching(Strict):
    max_sequence_idle_microseconds: int = Field(0, ge=0)
    control_input: tuple[ControlInput, ...] = ()
    direct: StrategyDirect | None = None
    oldest: StrategyOldest | None = None
    state: tuple[SequenceState, ...] = ()
    iterative_sequence: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> SequenceBatching:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("give one strategy: direct or oldest")
        if self.iterative_sequence:
            raise ValueError("iterative_sequence is not supported (it needs a decoupled backend)")
        kinds = [c.control[0].kind for c in self.control_input]
        twice = sorted({k for k in kinds if kinds.count(k) > 1})
        if twice:
            raise ValueError(f"each control appears once; repeated: {twice}")
        names = [c.name for c in self.control_input] + [s.input_name for s in self.state]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"control and state input names must be unique, repeated: {dupes}")
        return self

    @property
    def strategy(self) -> Literal["direct", "oldest"]:
        return "oldest" if self.oldest is not None else "direct"

    @property
    def idle_s(self) -> float:
        return (self.max_sequence_idle_microseconds or DEFAULT_IDLE_US) / 1e6

    def controls(self) -> list[ResolvedControl]:
        return [c.control[0].resolved(c.name) for c in self.control_input]

    def implicit_inputs(self) -> tuple[TensorSpec, ...]:
        """The model inputs the batcher fills (controls, then states), dims without the batch
        dimension: a client never sends them."""
        controls = tuple(TensorSpec(c.name, c.datatype, (1,)) for c in self.controls())
        return controls + tuple(TensorSpec(s.input_name, s.data_type, s.dims) for s in self.state)

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON of this section (data types spelled ``TYPE_*``)."""
        out = self.model_dump(exclude_defaults=True)
        out["max_sequence_idle_microseconds"] = self.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        for ci in out.get("control_input", []):
            for c in ci["control"]:
                c.setdefault("kind", "CONTROL_SEQUENCE_START")
                if c.get("data_type"):
                    c["data_type"] = oip_to_config_type(c["data_type"])
        for s in out.get("state", []):
            s["data_type"] = oip_to_config_type(s["data_type"])
            for init in s.get("initial_state", []):
                init["data_type"] = oip_to_config_type(init["data_type"])
        if self.direct is None and self.oldest is None:
            out["direct"] = {}
        return out
