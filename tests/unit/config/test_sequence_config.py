"""``sequence_batching`` (config/sequence_batching.py): Triton's configs load, wrong ones are refused
with the field named, and the section goes back out as Triton's JSON and protobuf."""

from __future__ import annotations

from pathlib import Path

import pytest

from milliserve.config.model_config import load_model_config
from milliserve.config.triton_json import config_to_dict, config_to_proto
from milliserve.errors import ConfigError

HEAD = 'name: "m"\nmax_batch_size: 8\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
DYNA = """
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ -1, 3 ]
            initial_state { data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true } } ]
}
"""


def load(tmp_path: Path, text: str) -> object:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    return load_model_config(tmp_path / "m")


def test_triton_config_loads_and_round_trips(tmp_path: Path) -> None:
    cfg = load(tmp_path, HEAD + DYNA)
    sb = cfg.sequence_batching  # type: ignore[attr-defined]
    assert sb.strategy == "oldest" and sb.idle_s == 5.0
    controls = {c.name: (c.kind, c.datatype, c.false, c.true) for c in sb.controls()}
    assert controls == {
        "START": ("CONTROL_SEQUENCE_START", "FP32", 0.0, 1.0),
        "END": ("CONTROL_SEQUENCE_END", "BOOL", False, True),
        "READY": ("CONTROL_SEQUENCE_READY", "INT32", 0, 1),
        "CORRID": ("CONTROL_SEQUENCE_CORRID", "BYTES", None, None),
    }
    assert [(t.name, t.datatype, t.dims) for t in sb.implicit_inputs()][-1] == ("S_IN", "FP32", (-1, 3))
    assert sb.state[0].start_dims() == (2, 3)
    out = config_to_dict(cfg)["sequence_batching"]  # type: ignore[arg-type]
    assert out["control_input"][3]["control"][0]["data_type"] == "TYPE_STRING"
    proto = config_to_proto(cfg)  # type: ignore[arg-type]
    assert proto.sequence_batching.oldest.max_candidate_sequences == 4
    assert proto.sequence_batching.state[0].initial_state[0].zero_data


def test_defaults_are_tritons(tmp_path: Path) -> None:
    text = (
        HEAD
        + 'sequence_batching { control_input [ { name: "S" control [ { int32_false_true: [0, 1] } ] } ] }'
    )
    sb = load(tmp_path, text).sequence_batching  # type: ignore[attr-defined]
    assert sb.strategy == "direct" and sb.idle_s == 1.0  # 1 s, as Triton
    assert sb.controls()[0].kind == "CONTROL_SEQUENCE_START"  # the enum's 0


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ("sequence_batching { direct { } oldest { } }", "one strategy|oneof"),
        (
            'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID } ] } '
            "] }",
            "needs data_type",
        ),
        (
            'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [0, 1] fp32_false_true: [0, 1] } ] } ] }",
            "exactly one of",
        ),
        (
            'sequence_batching { control_input [ { name: "S" control [ { int32_false_true: [1] } ] } ] }',
            "two values",
        ),
        (
            'sequence_batching { control_input [ { name: "INPUT" control [ { int32_false_true: [0, 1] } ] '
            "} ] }",
            "filled by the sequence batcher",
        ),
        ("sequence_batching { iterative_sequence: true }", "not supported"),
        ("sequence_batching { }\ndynamic_batching { }", "exclude each other"),
        (
            'sequence_batching { state [ { input_name: "A" output_name: "B" data_type: TYPE_FP32 '
            'initial_state { data_type: TYPE_FP32 zero_data: true data_file: "f" } } ] }',
            "exactly one of zero_data or data_file|oneof",
        ),
    ],
)
def test_wrong_sections_name_the_field(tmp_path: Path, section: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(tmp_path, HEAD + section)
