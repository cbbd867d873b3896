"""The generative backend protocol: the registry tells a generative engine's factory from a
tensor backend's by its declared type (backends/base.py), not by an attribute it may lack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from milliserve.backends.base import GenerativeBackendFactory
from milliserve.backends.llama_cpp import FACTORY
from milliserve.backends.registry import backend_for, factory_for, generative_backend_for
from milliserve.config.model_config import ModelConfig
from milliserve.errors import BackendError


def test_the_llama_cpp_factory_is_a_generative_backend_found_by_its_file(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert isinstance(FACTORY, GenerativeBackendFactory)
    assert generative_backend_for(None, tmp_path, "w") is FACTORY
    assert factory_for(ModelConfig(name="m", backend="llama_cpp"), tmp_path, "w") is FACTORY
    with pytest.raises(BackendError, match="llama_cpp serves generative models"):
        backend_for(None, tmp_path, "w")


def test_a_tensor_backend_is_not_generative(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")
    assert generative_backend_for(None, tmp_path, "w") is None
    assert backend_for(None, tmp_path, "w").name == "onnxruntime"


def test_a_generative_factory_must_implement_the_protocol() -> None:
    class Partial(GenerativeBackendFactory):
        name = "partial"
        platforms = ("partial",)
        model_filename = "model.bin"

        def options(self, config: Any) -> Any:
            return None

    with pytest.raises(TypeError, match="load_model"):
        Partial()  # type: ignore[abstract]
