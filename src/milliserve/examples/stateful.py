"""``running_stats``: a stateful ONNX model with implicit state (the sequence batcher).

Per sequence it keeps the running sum of its inputs and how many requests it has seen;
the model itself holds nothing: the server feeds each request the state the sequence's
previous request produced (``sequence_batching { state [...] }``), and the initial state
(zeros) on a request that starts the sequence. Its outputs therefore prove the state was
carried (TOTAL is the sum so far, COUNT the requests so far) and reset at START.

    X [4] FP32  ->  TOTAL [4] = X + (START ? 0 : SUM_IN)       (state SUM_IN <- TOTAL)
                    COUNT [1] = 1 + (START ? 0 : COUNT_IN)      (state COUNT_IN <- COUNT)
                    MEAN  [4] = TOTAL / COUNT
                    CORR  [1] = the correlation id (CONTROL_SEQUENCE_CORRID, UINT64)

START is a BOOL control, READY an INT32 one (a row without a request, under the direct
strategy, is READY 0 and its outputs are ignored).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

__all__ = ["build_running_stats"]

_F, _I64, _U64, _B, _I32 = (
    TensorProto.FLOAT,
    TensorProto.INT64,
    TensorProto.UINT64,
    TensorProto.BOOL,
    TensorProto.INT32,
)


def _config(
    name: str, max_batch_size: int, strategy: str, idle_us: int, instances: int, delay_us: int
) -> str:
    return f"""\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "TOTAL" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "MEAN" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "CORR" data_type: TYPE_UINT64 dims: [ 1 ] }}
]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy} {{ max_queue_delay_microseconds: {delay_us} }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [
    {{ input_name: "SUM_IN" output_name: "TOTAL" data_type: TYPE_FP32 dims: [ 4 ] }},
    {{ input_name: "COUNT_IN" output_name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }}
  ]
}}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
"""


def build_running_stats(
    repo: Path,
    name: str = "running_stats",
    max_batch_size: int = 4,
    strategy: str = "direct",
    idle_us: int = 5_000_000,
    instances: int = 1,
    queue_delay_us: int = 0,
) -> Path:
    """Write the model and its config into ``repo/name``; returns the model folder.
    ``queue_delay_us``: how long a batch may wait for more sequences to send."""
    b: list[int | str] = ["batch"] if max_batch_size > 0 else []
    nodes = [
        helper.make_node("Not", ["START"], ["carry_b"]),
        helper.make_node("Cast", ["carry_b"], ["carry_f"], to=_F),
        helper.make_node("Cast", ["carry_b"], ["carry_i"], to=_I64),
        helper.make_node("Mul", ["SUM_IN", "carry_f"], ["sum_kept"]),
        helper.make_node("Add", ["X", "sum_kept"], ["TOTAL"]),
        helper.make_node("Mul", ["COUNT_IN", "carry_i"], ["count_kept"]),
        helper.make_node("Add", ["count_kept", "one"], ["COUNT"]),
        helper.make_node("Cast", ["COUNT"], ["count_f"], to=_F),
        helper.make_node("Div", ["TOTAL", "count_f"], ["MEAN"]),
        helper.make_node("Identity", ["CORRID"], ["CORR"]),
    ]
    io = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        name,
        [
            io("X", _F, [*b, 4]),
            io("START", _B, [*b, 1]),
            io("READY", _I32, [*b, 1]),
            io("CORRID", _U64, [*b, 1]),
            io("SUM_IN", _F, [*b, 4]),
            io("COUNT_IN", _I64, [*b, 1]),
        ],
        [
            io("TOTAL", _F, [*b, 4]),
            io("COUNT", _I64, [*b, 1]),
            io("MEAN", _F, [*b, 4]),
            io("CORR", _U64, [*b, 1]),
        ],
        [helper.make_tensor("one", _I64, [], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(
        _config(name, max_batch_size, strategy, idle_us, instances, queue_delay_us)
    )
    return folder
