"""config.pbtxt and config.yaml parsing: every supported field, and errors that name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from milliserve.config.model_config import load_model_config
from milliserve.config.triton_json import config_to_dict, config_to_proto
from milliserve.errors import ConfigError

FULL_PBTXT = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 300
  default_queue_policy {
    max_queue_size: 64 default_timeout_microseconds: 5000
    timeout_action: DELAY allow_timeout_override: true
  }
  priority_levels: 3
  default_priority_level: 2
}
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
model_warmup [ { name: "w" batch_size: 2 count: 3
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
"""


def write(tmp_path: Path, text: str, filename: str = "config.pbtxt", model: str = "m") -> Path:
    d = tmp_path / model
    d.mkdir(exist_ok=True)
    (d / filename).write_text(text)
    return d


def test_full_triton_config_is_understood(tmp_path: Path) -> None:
    cfg = load_model_config(write(tmp_path, FULL_PBTXT))
    assert cfg is not None
    assert cfg.max_batch_size == 16
    assert [t.data_type for t in cfg.input] == ["FP32", "BYTES"]
    db = cfg.dynamic_batching
    assert db is not None and db.preferred_batch_size == (4, 8) and db.max_queue_delay_microseconds == 300
    assert db.default_queue_policy.timeout_action == "DELAY" and db.default_queue_policy.max_queue_size == 64
    assert db.priority_levels == 3 and db.default_priority_level == 2
    assert cfg.instance_count == 2
    assert cfg.version_policy.select([1, 2, 3, 4]) == [1, 3]
    assert cfg.model_warmup[0].count == 3 and cfg.model_warmup[0].inputs["INPUT0"].random_data
    assert cfg.parameters == {"intra_op_thread_count": "1", "inter_op_thread_count": "1"}
    # and it goes back out as Triton JSON and protobuf unchanged
    d = config_to_dict(cfg)
    assert d["input"][1]["data_type"] == "TYPE_STRING" and d["max_batch_size"] == 16
    assert config_to_proto(cfg).dynamic_batching.default_queue_policy.max_queue_size == 64


def test_native_yaml_accepts_the_same_fields(tmp_path: Path) -> None:
    yaml_text = """
max_batch_size: 8
input: [{name: x, data_type: FP32, dims: [4]}]
output: [{name: y, data_type: TYPE_FP32, dims: [4]}]
dynamic_batching: {max_queue_delay_microseconds: 100}
version_policy: {latest: {num_versions: 2}}
parameters: {intra_op_thread_count: 2}
"""
    cfg = load_model_config(write(tmp_path, yaml_text, "config.yaml"))
    assert cfg is not None and cfg.name == "m" and cfg.parameters == {"intra_op_thread_count": "2"}
    assert cfg.version_policy.select([1, 2, 3]) == [2, 3]


@pytest.mark.parametrize(
    ("text", "filename", "match"),
    [
        (
            'name: "m"\noptimization { }',
            "config.pbtxt",
            r"config.pbtxt: .*no field named \"optimization\"",
        ),
        ('name: "m"\nmax_batch_size: "x"', "config.pbtxt", r"config.pbtxt"),
        ('name: "m"\ninput [ { name: "a" data_type: TYPE_FLOAT dims: [1] } ]', "config.pbtxt", r"TYPE_FLOAT"),
        # an unknown platform is refused when the model loads, by the backend registry
        # (tests/unit/backends/test_registry.py), which knows the backends installed
        ('name: "other"', "config.pbtxt", r"field 'name'.*does not match"),
        (
            'name: "m"\nmax_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }',
            "config.pbtxt",
            r"preferred_batch_size \[8\] exceeds max_batch_size 4",
        ),
        ('name: "m"\ndynamic_batching { }', "config.pbtxt", r"dynamic_batching needs max_batch_size > 0"),
        (
            "max_batch_size: 4\nbatching: yes\n",
            "config.yaml",
            r"config.yaml: field 'batching': unknown or unsupported",
        ),
        ("input: [{name: a, data_type: FP32, dims: [0]}]\n", "config.yaml", r"field 'input.0.dims'"),
        ("instance_group: [{count: 0}]\n", "config.yaml", r"field 'instance_group.0.count'"),
        (
            "max_batch_size: 4\ndynamic_batching: {priority_levels: 2, default_priority_level: 3}\n",
            "config.yaml",
            r"default_priority_level must be in 1..2",
        ),
        (
            "version_policy: {latest: {num_versions: 1}, all: {}}\n",
            "config.yaml",
            r"one of latest, all, specific",
        ),
        (
            "model_warmup: [{inputs: {x: {data_type: FP32, dims: [1]}}}]\n",
            "config.yaml",
            r"zero_data or random_data",
        ),
        ("- just\n- a list\n", "config.yaml", r"top level must be a mapping"),
    ],
)
def test_wrong_or_unsupported_fields_name_the_file_and_field(
    tmp_path: Path, text: str, filename: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        load_model_config(write(tmp_path, text, filename))


def test_two_config_files_are_an_error_and_none_is_fine(tmp_path: Path) -> None:
    d = write(tmp_path, 'name: "m"')
    (d / "config.yaml").write_text("name: m\n")
    with pytest.raises(ConfigError, match="keep only one"):
        load_model_config(d)
    empty = tmp_path / "bare"
    empty.mkdir()
    assert load_model_config(empty) is None
