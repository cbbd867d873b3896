"""Triton's example model repository, written here as ONNX (``milliserve examples triton``).

NVIDIA's Python example clients (triton-inference-server/client, src/python/examples)
call models of Triton's ``docs/examples/model_repository`` by name. This module writes
models with the same names, tensors and configs, built from ONNX operators here (nothing is
downloaded or copied), so those clients run unchanged against ``milliserve serve``:

- ``simple`` (INT32), ``simple_int8``, ``simple_string`` (numbers as strings): OUTPUT0 =
  INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, 16 elements, batches of up to 8;
- ``simple_identity``: strings in, the same strings out (Triton's is a Python model);
- ``simple_sequence`` (direct strategy, START and READY) and ``simple_dyna_sequence``
  (oldest, START, END, READY, CORRID): the stateless sequence models of Triton's repository,
  OUTPUT = (INPUT + START) * READY, plus END * CORRID for the dyna one;
- ``simple_string_dyna_sequence``: what Triton's test scripts build with the ``dyna_sequence``
  C++ backend (string correlation ids), here an ONNX model with implicit state: OUTPUT is
  the running sum of the sequence's inputs, plus the correlation id on its last request;
- ``custom_identity_int32``: Triton's test identity model (memory_growth_test.py).

Differences: configs name ``platform: "onnxruntime_onnx"`` (simple_identity's is Triton's
Python backend), and simple_dyna_sequence leaves out ``parameters { execute_delay_ms }``,
which only Triton's C++ test backend reads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

__all__ = ["TRITON_EXAMPLES", "build_triton_examples"]

_I32, _I8, _STR, _U64 = TensorProto.INT32, TensorProto.INT8, TensorProto.STRING, TensorProto.UINT64


def _io(name: str, elem: int, dims: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _save(repo: Path, name: str, graph: onnx.GraphProto, config: str) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    vdir = repo / name / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(vdir / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def _add_sub_config(name: str, triton_type: str) -> str:
    tensor = '{{ name: "{}" data_type: {} dims: [ 16 ] }}'
    ins = ", ".join(tensor.format(n, triton_type) for n in ("INPUT0", "INPUT1"))
    outs = ", ".join(tensor.format(n, triton_type) for n in ("OUTPUT0", "OUTPUT1"))
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f"input [ {ins} ]\noutput [ {outs} ]\n"
    )


def _add_sub(repo: Path, name: str, elem: int, triton_type: str) -> Path:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, computed in INT32."""
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=_I32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=_I32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["diff"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=elem),
        helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=elem),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [_io("INPUT0", elem, ["batch", 16]), _io("INPUT1", elem, ["batch", 16])],
        [_io("OUTPUT0", elem, ["batch", 16]), _io("OUTPUT1", elem, ["batch", 16])],
    )
    return _save(repo, name, graph, _add_sub_config(name, triton_type))


def build_simple(repo: Path) -> Path:
    return _add_sub(repo, "simple", _I32, "TYPE_INT32")


def build_simple_int8(repo: Path) -> Path:
    return _add_sub(repo, "simple_int8", _I8, "TYPE_INT8")


def build_simple_string(repo: Path) -> Path:
    return _add_sub(repo, "simple_string", _STR, "TYPE_STRING")


def build_simple_identity(repo: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "simple_identity",
        [_io("INPUT0", _STR, ["batch", "n"])],
        [_io("OUTPUT0", _STR, ["batch", "n"])],
    )
    config = (
        'name: "simple_identity"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
    )
    return _save(repo, "simple_identity", graph, config)


def build_custom_identity_int32(repo: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "custom_identity_int32",
        [_io("INPUT0", _I32, ["batch", "n"])],
        [_io("OUTPUT0", _I32, ["batch", "n"])],
    )
    config = (
        'name: "custom_identity_int32"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    )
    return _save(repo, "custom_identity_int32", graph, config)


def _control(name: str, kind: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}'


_SEQUENCE_IO = (
    'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
)


def build_simple_sequence(repo: Path) -> Path:
    """Triton's ONNX ``simple_sequence``: OUTPUT = (INPUT + START) * READY."""
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["add"]),
        helper.make_node("Mul", ["READY", "add"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "simple_sequence",
        [_io(n, _I32, ["batch", 1]) for n in ("INPUT", "START", "READY")],
        [_io("OUTPUT", _I32, ["batch", 1])],
    )
    config = (
        'name: "simple_sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching {\n  control_input [\n    "
        + _control("START", "CONTROL_SEQUENCE_START")
        + ",\n    "
        + _control("READY", "CONTROL_SEQUENCE_READY")
        + "\n  ]\n}\n"
        + _SEQUENCE_IO
        + "instance_group [ { kind: KIND_CPU } ]\n"
    )
    return _save(repo, "simple_sequence", graph, config)


def _dyna_config(name: str, corrid_type: str, state: str = "") -> str:
    controls = ",\n    ".join(
        [
            _control("START", "CONTROL_SEQUENCE_START"),
            _control("END", "CONTROL_SEQUENCE_END"),
            _control("READY", "CONTROL_SEQUENCE_READY"),
            f'{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}',
        ]
    )
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching {\n  max_sequence_idle_microseconds: 10000000\n"
        "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n"
        f"  control_input [\n    {controls}\n  ]\n{state}}}\n"
        + _SEQUENCE_IO
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
    )


def build_simple_dyna_sequence(repo: Path) -> Path:
    """Triton's ONNX ``simple_dyna_sequence``: OUTPUT = (INPUT + START + END * CORRID) * READY."""
    nodes = [
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=_I32),
        helper.make_node("Add", ["INPUT", "START"], ["add0"]),
        helper.make_node("Mul", ["END", "corrid"], ["mul0"]),
        helper.make_node("Add", ["add0", "mul0"], ["sum0"]),
        helper.make_node("Mul", ["READY", "sum0"], ["OUTPUT"]),
    ]
    inputs = [_io(n, _I32, ["batch", 1]) for n in ("INPUT", "START", "END", "READY")]
    graph = helper.make_graph(
        nodes,
        "simple_dyna_sequence",
        [*inputs, _io("CORRID", _U64, ["batch", 1])],
        [_io("OUTPUT", _I32, ["batch", 1])],
    )
    return _save(repo, "simple_dyna_sequence", graph, _dyna_config("simple_dyna_sequence", "TYPE_UINT64"))


def build_simple_string_dyna_sequence(repo: Path) -> Path:
    """Triton's test ``simple_string_dyna_sequence`` (string correlation ids) with implicit
    state: the state is the running sum (reset by START), OUTPUT = (state + END * CORRID) * READY
    where CORRID is the string id read as a number."""
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["not_start"]),
        helper.make_node("Mul", ["SUM_IN", "not_start"], ["carried"]),
        helper.make_node("Add", ["carried", "INPUT"], ["SUM_OUT"]),
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=_I32),
        helper.make_node("Mul", ["END", "corrid"], ["last"]),
        helper.make_node("Add", ["SUM_OUT", "last"], ["out"]),
        helper.make_node("Mul", ["READY", "out"], ["OUTPUT"]),
    ]
    inputs = [_io(n, _I32, ["batch", 1]) for n in ("INPUT", "START", "END", "READY", "SUM_IN")]
    graph = helper.make_graph(
        nodes,
        "simple_string_dyna_sequence",
        [*inputs, _io("CORRID", _STR, ["batch", 1])],
        [_io("OUTPUT", _I32, ["batch", 1]), _io("SUM_OUT", _I32, ["batch", 1])],
        [helper.make_tensor("one", _I32, [], [1])],
    )
    state = (
        '  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] '
        "initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]\n"
    )
    name = "simple_string_dyna_sequence"
    return _save(repo, name, graph, _dyna_config(name, "TYPE_STRING", state))


TRITON_EXAMPLES: dict[str, Callable[[Path], Path]] = {
    "simple": build_simple,
    "simple_int8": build_simple_int8,
    "simple_string": build_simple_string,
    "simple_identity": build_simple_identity,
    "simple_sequence": build_simple_sequence,
    "simple_dyna_sequence": build_simple_dyna_sequence,
    "simple_string_dyna_sequence": build_simple_string_dyna_sequence,
    "custom_identity_int32": build_custom_identity_int32,
}


def build_triton_examples(repo: Path, only: list[str] | None = None) -> list[Path]:
    """Write Triton's example models (all, or ``only`` these) into ``repo``; returns their
    folders. KeyError naming an unknown model."""
    names = only or list(TRITON_EXAMPLES)
    unknown = sorted(set(names) - set(TRITON_EXAMPLES))
    if unknown:
        raise KeyError(f"unknown Triton examples {unknown}; choose from {sorted(TRITON_EXAMPLES)}")
    repo.mkdir(parents=True, exist_ok=True)
    return [TRITON_EXAMPLES[n](repo) for n in names]
