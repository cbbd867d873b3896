"""OpenVINO backend: parameters read as Triton's openvino_backend names them, element types
mapped to OIP datatypes, a static batch dimension made dynamic, outputs equal to OpenVINO's
own run at f32, output buffers copied, and input errors reported as the client's."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from milliserve.backends.openvino import (
    FACTORY,
    INSTALL_HINT,
    OpenVinoBackend,
    device_name,
    parse_ov_options,
    tensor_spec,
)
from milliserve.backends.registry import Instance, backend_for
from milliserve.config.model_config import InstanceGroup, ModelConfig
from milliserve.errors import BackendError, ConfigError, InvalidInputError


def cfg(max_batch_size: int = 8, count: int = 1, **params: str) -> ModelConfig:
    return ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        instance_group=(InstanceGroup(count=count),),
        parameters=params,
    )


def backend(model_dir: Path, config: ModelConfig | None = None) -> OpenVinoBackend:
    return OpenVinoBackend(model_dir / "1" / "model.xml", parse_ov_options(config or cfg()))


@pytest.fixture(scope="module")
def static1(tmp_path_factory: pytest.TempPathFactory, openvino_mlp: Any) -> Path:
    """ov_mlp exported with a static batch dimension of 1."""
    return openvino_mlp.write(tmp_path_factory.mktemp("ov"))  # type: ignore[no-any-return]


def test_parameters_are_read_with_tritons_names() -> None:
    o = parse_ov_options(
        cfg(
            INFERENCE_NUM_THREADS="3",
            INFERENCE_PRECISION_HINT="BF16",
            PERFORMANCE_HINT="throughput",
            NUM_STREAMS="numa",
            inline_execution="false",
        )
    )
    assert (o.inference_threads, o.precision, o.performance_hint, o.num_streams) == (
        3,
        "bf16",
        "THROUGHPUT",
        "NUMA",
    )
    assert o.properties("CPU") == {
        "INFERENCE_PRECISION_HINT": "bf16",
        "PERFORMANCE_HINT": "THROUGHPUT",
        "NUM_STREAMS": "NUMA",
        "INFERENCE_NUM_THREADS": "3",
    }
    assert "INFERENCE_NUM_THREADS" not in o.properties("GPU")  # a CPU plugin property
    assert parse_ov_options(cfg(HINT_BF16="yes")).precision == "bf16"
    assert parse_ov_options(cfg(NUM_STREAMS="2")).num_streams == "2"


def test_defaults_pin_f32_latency_and_share_the_cores_between_instances() -> None:
    cores = os.cpu_count() or 1
    o = parse_ov_options(cfg(count=2))
    assert (o.precision, o.performance_hint, o.num_streams, o.dynamic_batch) == ("f32", "LATENCY", None, True)
    assert o.inference_threads == max(1, cores // 2) == FACTORY.threads(o)
    assert FACTORY.threads(parse_ov_options(cfg(INFERENCE_NUM_THREADS="1"))) == 1
    assert FACTORY.threads(parse_ov_options(cfg(INFERENCE_NUM_THREADS="0"))) == cores  # OpenVINO decides
    assert not parse_ov_options(cfg(max_batch_size=0)).dynamic_batch
    assert not parse_ov_options(cfg(SKIP_OV_DYNAMIC_BATCHSIZE="YES")).dynamic_batch


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"CPU_THREADS_NUM": "2"}, r"unknown parameters \['CPU_THREADS_NUM'\]; the openvino backend knows"),
        ({"intra_op_thread_count": "1"}, r"unknown parameters \['intra_op_thread_count'\]"),
        ({"INFERENCE_NUM_THREADS": "-1"}, r"'INFERENCE_NUM_THREADS' must be a number >= 0"),
        ({"INFERENCE_NUM_THREADS": "two"}, r"'INFERENCE_NUM_THREADS' must be a number >= 0 .*, got 'two'"),
        (
            {"INFERENCE_PRECISION_HINT": "int8"},
            r"'INFERENCE_PRECISION_HINT' must be one of \['f32', 'bf16', 'f16'\], got 'int8'",
        ),
        (
            {"PERFORMANCE_HINT": "FAST"},
            r"'PERFORMANCE_HINT' must be one of \['LATENCY', 'THROUGHPUT', 'CUMULATIVE_THROUGHPUT'\]",
        ),
        ({"NUM_STREAMS": "many"}, r"'NUM_STREAMS' must be one of \['AUTO', 'NUMA'\] or a number > 0"),
        ({"NUM_STREAMS": "0"}, r"'NUM_STREAMS' must be one of"),
        ({"HINT_BF16": "maybe"}, r"'HINT_BF16' must be one of \['YES', 'NO'\], got 'maybe'"),
        ({"SKIP_OV_DYNAMIC_BATCHSIZE": "1"}, r"'SKIP_OV_DYNAMIC_BATCHSIZE' must be one of \['YES', 'NO'\]"),
        ({"HINT_BF16": "YES", "INFERENCE_PRECISION_HINT": "f16"}, r"'HINT_BF16' YES and .* disagree"),
    ],
)
def test_bad_parameters_name_the_parameter_and_the_allowed_values(params: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FACTORY.options(cfg(**params))


def test_element_types_map_to_oip_datatypes(tmp_path: Path) -> None:
    types = {
        "f32": "FP32",
        "f16": "FP16",
        "bf16": "BF16",
        "f64": "FP64",
        "i8": "INT8",
        "i16": "INT16",
        "i32": "INT32",
        "i64": "INT64",
        "u8": "UINT8",
        "u16": "UINT16",
        "u32": "UINT32",
        "u64": "UINT64",
        "boolean": "BOOL",
    }
    params = []
    for element in types:
        p = ops.parameter([-1, 3], getattr(ov.Type, element), name=element)
        p.output(0).set_names({f"in_{element}"})
        params.append(p)
    model = ov.Model([ops.result(p) for p in params], params, "types")
    assert [(s.name, s.datatype, s.dims) for s in map(tensor_spec, model.inputs)] == [
        (f"in_{element}", datatype, (-1, 3)) for element, datatype in types.items()
    ]
    u4 = ops.parameter([2], ov.Type.u4, name="packed")
    u4.output(0).set_names({"packed"})
    with pytest.raises(BackendError, match=r"tensor 'packed' has type u4, which milliserve cannot serve"):
        tensor_spec(ov.Model([ops.result(u4)], [u4], "u4").inputs[0])


def test_a_static_batch_dimension_is_made_dynamic(static1: Path, openvino_mlp: Any) -> None:
    assert ov.Core().read_model(static1 / "1" / "model.xml").inputs[0].get_partial_shape() == [1, 16]
    b = backend(static1)
    info = b.info()
    assert info.platform == "openvino"
    assert [(s.name, s.datatype, s.dims) for s in info.inputs] == [("x", "FP32", (-1, 16))]
    assert [(s.name, s.datatype, s.dims) for s in info.outputs] == [
        ("probs", "FP32", (-1, 4)),
        ("label", "INT64", (-1, 1)),
    ]
    x = np.random.default_rng(1).normal(size=(5, 16)).astype(np.float32)
    out = b.run({"x": x}, ["label", "probs"])
    assert list(out) == ["label", "probs"] and out["probs"].shape == (5, 4)
    np.testing.assert_array_equal(out["label"], openvino_mlp.reference(x)[1])
    # without the reshape the model keeps its batch of 1, and a batch of 5 is the client's error
    kept = backend(static1, cfg(SKIP_OV_DYNAMIC_BATCHSIZE="YES"))
    assert kept.info().inputs[0].dims == (1, 16)
    assert backend(static1, cfg(max_batch_size=0)).info().inputs[0].dims == (1, 16)
    with pytest.raises(InvalidInputError, match=r"shape=\[1,16\]\) and the tensor \(shape=\(5\.16\)\)"):
        kept.run({"x": x}, ["probs"])


def test_outputs_equal_openvinos_own_run_at_f32(tmp_path: Path, openvino_mlp: Any) -> None:
    model_dir = openvino_mlp.write(tmp_path, batch="batch")
    x = np.random.default_rng(2).normal(size=(7, 16)).astype(np.float32)
    out = backend(model_dir).run({"x": x}, ["probs", "label"])
    compiled = ov.Core().compile_model(
        str(model_dir / "1" / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    own = compiled({"x": x})
    np.testing.assert_array_equal(out["probs"], own["probs"])
    np.testing.assert_array_equal(out["label"], own["label"])
    assert out["probs"].dtype == np.float32 and out["label"].dtype == np.int64
    # f32 indeed: bf16, which OpenVINO picks by itself on CPUs that have it, is off by ~1e-2
    probs, label = openvino_mlp.reference(x)
    np.testing.assert_allclose(out["probs"], probs, atol=1e-5)
    np.testing.assert_array_equal(out["label"], label)


def test_each_result_is_a_copy_of_openvinos_reused_buffers(static1: Path) -> None:
    b = backend(static1)
    rng = np.random.default_rng(3)
    x1, x2 = (rng.normal(size=(4, 16)).astype(np.float32) for _ in range(2))
    first = b.run({"x": x1}, ["probs"])["probs"]
    kept = first.copy()
    second = b.run({"x": x2}, ["probs"])["probs"]
    assert not np.array_equal(second, kept)
    np.testing.assert_array_equal(first, kept)  # the second run did not write into the first result
    assert first.flags.writeable and first.flags.owndata


def test_shape_errors_are_the_clients_and_read_without_source_lines(tmp_path: Path) -> None:
    a = ops.parameter([-1, -1], np.float32, name="a")
    b = ops.parameter([-1, -1], np.float32, name="b")
    a.output(0).set_names({"a"})
    b.output(0).set_names({"b"})
    total = ops.add(a, b)
    total.output(0).set_names({"sum"})
    (tmp_path / "1").mkdir()
    ov.save_model(ov.Model([total], [a, b], "add"), str(tmp_path / "1" / "model.xml"))
    add = backend(tmp_path, cfg(max_batch_size=0))
    two = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(add.run({"a": two, "b": two}, ["sum"])["sum"], two * 2)
    with pytest.raises(InvalidInputError) as err:  # a node's shape inference on the data
        add.run({"a": two, "b": np.ones((2, 5), np.float32)}, ["sum"])
    assert "mismatch" in str(err.value) and "Exception from" not in str(err.value)
    with pytest.raises(InvalidInputError) as err:  # the input itself
        add.run({"a": np.ones(3, np.float32), "b": two}, ["sum"])
    assert "src/" not in str(err.value) and "\n" not in str(err.value)


def test_model_files_that_do_not_load_fail_clearly(tmp_path: Path, static1: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.xml").write_bytes((static1 / "1" / "model.xml").read_bytes())
    with pytest.raises(BackendError, match=r"openvino could not read .*model\.xml"):
        backend(tmp_path)  # model.bin is missing


def test_found_by_platform_backend_or_model_xml(static1: Path) -> None:
    vdir = static1 / "1"
    assert backend_for(ModelConfig(name="m", platform="openvino"), vdir, "w") is FACTORY
    assert backend_for(ModelConfig(name="m", backend="openvino"), vdir, "w") is FACTORY
    assert backend_for(None, vdir, "w") is FACTORY  # by model.xml
    assert (FACTORY.name, FACTORY.platforms, FACTORY.model_filename) == (
        "openvino",
        ("openvino",),
        "model.xml",
    )


def test_devices_follow_the_instance_kind() -> None:
    assert device_name(Instance("m_0")) == "CPU"
    assert device_name(Instance("m_0", "KIND_GPU", 0)) == "GPU"
    assert device_name(Instance("m_1", "KIND_GPU", 1)) == "GPU.1"
    assert FACTORY.gpu_available() == any(d.startswith("GPU") for d in ov.Core().available_devices)


def test_without_openvino_the_model_fails_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # what `import openvino` meets when absent
    with pytest.raises(
        ConfigError, match=r"needs the openvino package: pip install 'milliserve\[openvino\]'"
    ):
        FACTORY.options(cfg())
    assert "milliserve[openvino]" in INSTALL_HINT
