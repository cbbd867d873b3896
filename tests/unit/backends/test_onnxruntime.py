"""ONNX Runtime backend options: threads, optimisation level, providers that degrade clearly,
and GPU instances that fail clearly without CUDA."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from milliserve.backends.onnxruntime import FACTORY, OnnxRuntimeBackend, parse_ort_options
from milliserve.backends.registry import Instance
from milliserve.config.model_config import ModelConfig
from milliserve.errors import BackendError, ConfigError, InvalidInputError


def cfg(**params: str) -> ModelConfig:
    return ModelConfig(name="m", parameters=params)


def test_options_are_read_from_parameters() -> None:
    o = parse_ort_options(
        cfg(
            intra_op_thread_count="3",
            inter_op_thread_count="2",
            graph_optimization_level="basic",
            allow_spinning="1",
        )
    )
    assert (o.intra_op_threads, o.inter_op_threads, o.graph_optimization_level, o.allow_spinning) == (
        3,
        2,
        "basic",
        True,
    )
    assert o.providers == ("CPUExecutionProvider",)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"intra_op_thread_count": "many"}, "'intra_op_thread_count' must be an integer"),
        ({"graph_optimization_level": "max"}, "graph_optimization_level"),
        ({"execution_providers": "cuda,tpu"}, r"unknown \['tpu'\]"),
        ({"threads": "1"}, r"unknown parameters \['threads'\]"),
    ],
)
def test_bad_parameters_are_named(params: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_ort_options(cfg(**params))


ACCELERATORS = {
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
}


@pytest.mark.parametrize("name", sorted(ACCELERATORS))
def test_a_requested_provider_is_used_when_built_in_and_skipped_with_a_warning_when_not(
    name: str, tmp_path: Path, write_add_sub: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    write_add_sub(tmp_path)
    present = ACCELERATORS[name] in ort.get_available_providers()  # this build's, read not assumed
    options = parse_ort_options(cfg(execution_providers=name))
    assert options.providers == (ACCELERATORS[name], "CPUExecutionProvider")
    with caplog.at_level(logging.WARNING):
        backend = OnnxRuntimeBackend(tmp_path / "add_sub" / "1" / "model.onnx", options)
    lacking = [r.message for r in caplog.records if "this onnxruntime build lacks it" in r.message]
    if present:  # nothing to degrade from
        assert backend.info().notes == () and lacking == []
    else:  # runs on the CPU, and says why in the log and the model's notes
        (note,) = backend.info().notes
        assert f"execution provider {ACCELERATORS[name]} was requested" in note and "lacks it" in note
        assert len(lacking) == 1 and ACCELERATORS[name] in lacking[0]
    x = np.ones((1, 2), np.float32)
    out = backend.run({"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])
    np.testing.assert_allclose(out["OUTPUT0"], 2 * x)


def test_a_gpu_instance_without_cuda_fails_to_load_naming_it(
    tmp_path: Path, write_add_sub: Callable[..., Path]
) -> None:
    write_add_sub(tmp_path)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has CUDA: a KIND_GPU instance loads (test_registry runs one)")
    assert not FACTORY.gpu_available()
    gpu = Instance("m_0_0", "KIND_GPU", 0)
    with pytest.raises(BackendError, match=r"instance 'm_0_0' is KIND_GPU but .* no CUDAExecutionProvider"):
        OnnxRuntimeBackend(tmp_path / "add_sub" / "1" / "model.onnx", parse_ort_options(cfg()), gpu)


def test_data_the_model_rejects_is_a_client_error(example_repo: Path) -> None:
    backend = OnnxRuntimeBackend(example_repo / "minilm" / "1" / "model.onnx", parse_ort_options(cfg()))
    ids = np.array([[101, 10**9]], np.int64)  # a token id far past the vocabulary
    with pytest.raises(InvalidInputError, match=r"out of data bounds|indices"):
        backend.run({"input_ids": ids, "attention_mask": np.ones_like(ids)}, ["embedding"])
