"""ONNX Runtime backend options: threads, optimisation level, providers that degrade clearly."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from milliserve.backends.onnxruntime import OnnxRuntimeBackend, parse_ort_options
from milliserve.config.model_config import ModelConfig
from milliserve.errors import ConfigError, InvalidInputError


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


def test_missing_gpu_provider_degrades_to_cpu_with_a_clear_warning(
    tmp_path: Path, write_add_sub: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    write_add_sub(tmp_path)
    providers = {
        "cuda": "CUDAExecutionProvider",
        "tensorrt": "TensorrtExecutionProvider",
        "openvino": "OpenVINOExecutionProvider",
    }
    wanted = [k for k, v in providers.items() if v not in ort.get_available_providers()]
    assert wanted, "every accelerator provider is installed here: nothing to degrade from"
    options = parse_ort_options(cfg(execution_providers=",".join(wanted)))
    with caplog.at_level(logging.WARNING):
        backend = OnnxRuntimeBackend(tmp_path / "add_sub" / "1" / "model.onnx", options)
    assert backend.info().notes and "lacks it" in backend.info().notes[0]
    assert any("was requested but this onnxruntime build lacks it" in r.message for r in caplog.records)
    x = np.ones((1, 2), np.float32)
    out = backend.run({"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])
    np.testing.assert_allclose(out["OUTPUT0"], 2 * x)


def test_data_the_model_rejects_is_a_client_error(example_repo: Path) -> None:
    backend = OnnxRuntimeBackend(example_repo / "minilm" / "1" / "model.onnx", parse_ort_options(cfg()))
    ids = np.array([[101, 10**9]], np.int64)  # a token id far past the vocabulary
    with pytest.raises(InvalidInputError, match=r"out of data bounds|indices"):
        backend.run({"input_ids": ids, "attention_mask": np.ones_like(ids)}, ["embedding"])
