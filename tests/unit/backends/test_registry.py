"""The backend registry: a model's backend from its config or its file, and its instances
placed as Triton places them (count per GPU, KIND_AUTO, group names). Nothing in
instance_group is ignored: what cannot be placed is a config error naming the field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from milliserve.backends.base import Backend
from milliserve.backends.registry import (
    Instance,
    backend_for,
    expand_instances,
    known_backends,
    register_backend,
)
from milliserve.config.model_config import ModelConfig
from milliserve.errors import ConfigError


def cfg(**fields: Any) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", **fields})


def test_backend_by_platform_backend_or_model_file(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")
    assert backend_for(None, tmp_path, "m/config.pbtxt").name == "onnxruntime"  # by file
    assert backend_for(cfg(platform="onnxruntime_onnx"), tmp_path, "w").name == "onnxruntime"
    assert backend_for(cfg(backend="onnxruntime"), tmp_path, "w").model_filename == "model.onnx"
    with pytest.raises(
        ConfigError, match=r"m/config.pbtxt: field 'platform': 'tensorflow_savedmodel' is not"
    ):
        backend_for(cfg(platform="tensorflow_savedmodel"), tmp_path, "m/config.pbtxt")
    with pytest.raises(ConfigError, match=r"field 'backend': 'python' is not known"):
        backend_for(cfg(backend="python"), tmp_path, "w")
    with pytest.raises(ConfigError, match=r"no model file in this version directory"):
        backend_for(None, tmp_path / "empty", "w")


def test_a_registered_backend_is_found_by_its_platform(tmp_path: Path) -> None:
    class Echo:
        name, platforms, model_filename = "echo_test", ("echo_platform",), "model.echo"

        def options(self, config: ModelConfig) -> None:
            return None

        def threads(self, options: Any) -> int:
            return 1

        def gpu_available(self) -> bool:
            return False

        def create(self, model_path: Path, options: Any, instance: Instance) -> Backend:
            raise NotImplementedError  # never called here: the test is about the lookup

    register_backend(Echo())
    assert known_backends()["echo_test"] == ("echo_platform",)
    assert backend_for(cfg(platform="echo_platform"), tmp_path, "w").name == "echo_test"
    (tmp_path / "model.echo").write_bytes(b"")
    assert backend_for(None, tmp_path, "w").name == "echo_test"


def test_default_is_one_cpu_instance_named_after_the_model() -> None:
    assert expand_instances(cfg(), gpu_available=False, where="w") == [Instance("m_0_0", "KIND_CPU", -1)]


def test_count_names_and_kind_auto() -> None:
    groups = [{"name": "fast", "count": 2, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_AUTO"}]
    got = expand_instances(cfg(instance_group=groups), gpu_available=False, where="w")
    assert got == [
        Instance("fast_0", "KIND_CPU", -1),
        Instance("fast_1", "KIND_CPU", -1),
        Instance("m_1_0", "KIND_CPU", -1),  # KIND_AUTO without a GPU: the CPU
    ]
    auto = expand_instances(cfg(instance_group=[{"kind": "KIND_AUTO"}]), gpu_available=True, where="w")
    assert auto == [Instance("m_0_0", "KIND_GPU", 0)]


def test_count_is_per_listed_gpu() -> None:
    groups = [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 3]}]
    got = expand_instances(cfg(instance_group=groups), gpu_available=True, where="w")
    assert [(i.kind, i.device) for i in got] == [("KIND_GPU", 0)] * 2 + [("KIND_GPU", 3)] * 2
    assert len({i.name for i in got}) == 4


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"kind": "KIND_GPU"}], r"field 'instance_group\[0\]': kind KIND_GPU, but .* sees no GPU"),
        ([{"kind": "KIND_CPU", "gpus": [0]}], r"gpus \[0\] apply to KIND_GPU groups only"),
        ([{"name": "a", "count": 1}, {"name": "a", "count": 1}], r"instance names \['a_0'\] repeat"),
    ],
)
def test_what_cannot_be_placed_is_named(groups: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_instances(cfg(instance_group=groups), gpu_available=False, where="w")


def test_a_gpu_model_loads_on_a_gpu_and_fails_clearly_without_one(
    tmp_path: Path, write_add_sub: Callable[..., Path], run: Any
) -> None:
    import onnxruntime as ort

    from milliserve.testing import InProcessServer

    write_add_sub(tmp_path, config="instance_group [ { count: 1 kind: KIND_GPU } ]\n")
    has_gpu = "CUDAExecutionProvider" in ort.get_available_providers()  # read, not assumed

    async def main() -> None:
        async with InProcessServer(tmp_path, listen=False, strict_readiness=False) as server:
            (row,) = server.registry.index()
            if has_gpu:
                assert row["state"] == "READY", row
            else:
                assert row["state"] == "UNAVAILABLE" and "KIND_GPU" in row["reason"]
                assert str(tmp_path) not in row["reason"]  # paths read from the repository

    run(main())
