"""Backends chosen by a model's ``platform`` or ``backend`` (Triton's fields), or by the
model file in its version folder when the config names neither.

Built-in backends are listed by import path and imported only when a model uses
them, so ``import milliserve`` never imports an inference engine. Other packages add
theirs with ``register_backend``. Nothing above ``backends/`` names an engine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from milliserve.backends.base import Backend, GenerativeBackendFactory
from milliserve.config.model_config import InstanceGroup, ModelConfig
from milliserve.errors import BackendError, ConfigError

__all__ = [
    "AnyBackendFactory",
    "BackendFactory",
    "Instance",
    "backend_for",
    "expand_instances",
    "factory_for",
    "generative_backend_for",
    "known_backends",
    "register_backend",
]


@dataclass(frozen=True, slots=True)
class Instance:
    """One model instance to create: its name (Triton's ``<group>_<n>``), kind and device."""

    name: str
    kind: Literal["KIND_CPU", "KIND_GPU"] = "KIND_CPU"
    device: int = -1  # the GPU id for KIND_GPU


class BackendFactory(Protocol):
    """What the runtime needs of an engine. ``create`` and ``gpu_available`` may block;
    the runtime calls them off the event loop."""

    name: str  # the config's ``backend``
    platforms: tuple[str, ...]  # the config ``platform`` values it serves
    model_filename: str  # the file it loads from a version folder by default

    def options(self, config: ModelConfig) -> Any:
        """Parse the config's ``parameters``; raises ConfigError naming the parameter."""
        ...

    def threads(self, options: Any) -> int:
        """Threads one call uses (1 lets a microsecond model run beside the event loop)."""
        ...

    def gpu_available(self) -> bool: ...

    def create(self, model_path: Path, options: Any, instance: Instance) -> Backend: ...


# a tensor engine's factory, or a generative one's (backends/base.py)
AnyBackendFactory = BackendFactory | GenerativeBackendFactory


@dataclass(frozen=True, slots=True)
class _Builtin:
    platforms: tuple[str, ...]
    model_filename: str
    target: str  # "module:attribute" of the factory


_BUILTIN: dict[str, _Builtin] = {
    "onnxruntime": _Builtin(("onnxruntime_onnx",), "model.onnx", "milliserve.backends.onnxruntime:FACTORY"),
    "openvino": _Builtin(("openvino",), "model.xml", "milliserve.backends.openvino:FACTORY"),
    "llama_cpp": _Builtin(("llama_cpp",), "model.gguf", "milliserve.backends.llama_cpp:FACTORY"),
}
_registered: dict[str, AnyBackendFactory] = {}


def register_backend(factory: AnyBackendFactory) -> None:
    """Make ``factory`` available to models that name its backend or one of its platforms."""
    _registered[factory.name] = factory


def known_backends() -> dict[str, tuple[str, ...]]:
    """Backend name -> the platforms it serves."""
    known = {name: b.platforms for name, b in _BUILTIN.items()}
    known.update({name: f.platforms for name, f in _registered.items()})
    return known


def _load(name: str) -> AnyBackendFactory:
    factory = _registered.get(name)
    if factory is None:
        module, _, attr = _BUILTIN[name].target.partition(":")
        factory = _registered[name] = getattr(importlib.import_module(module), attr)
    return factory


def _filename(name: str) -> str:
    factory = _registered.get(name)
    return factory.model_filename if factory is not None else _BUILTIN[name].model_filename


def backend_for(config: ModelConfig | None, version_dir: Path, where: str) -> BackendFactory:
    """The tensor backend's factory for a model (``factory_for``); BackendError when the
    engine that serves it is a generative one."""
    factory = factory_for(config, version_dir, where)
    if isinstance(factory, GenerativeBackendFactory):
        raise BackendError(f"{factory.name} serves generative models; it has no tensor backend")
    return factory


def generative_backend_for(
    config: ModelConfig | None, version_dir: Path, where: str
) -> GenerativeBackendFactory | None:
    """The generative engine's factory for a model (``factory_for``), or None when a tensor
    backend serves it."""
    factory = factory_for(config, version_dir, where)
    return factory if isinstance(factory, GenerativeBackendFactory) else None


def factory_for(config: ModelConfig | None, version_dir: Path, where: str) -> AnyBackendFactory:
    """The factory for a model: by ``backend``, else ``platform``, else the model file present.
    Raises ConfigError naming the file and field when nothing serves it."""
    known = known_backends()
    if config is not None and config.backend:
        if config.backend not in known:
            raise ConfigError(
                f"{where}: field 'backend': {config.backend!r} is not known; use one of {sorted(known)}"
            )
        chosen = config.backend
        if config.platform and config.platform not in known[chosen]:
            raise ConfigError(
                f"{where}: field 'platform': {config.platform!r} is not served by backend {chosen!r} "
                f"(it serves {list(known[chosen])})"
            )
        return _load(chosen)
    if config is not None and config.platform:
        for name, platforms in known.items():
            if config.platform in platforms:
                return _load(name)
        every = sorted([*(p for ps in known.values() for p in ps), "ensemble"])
        raise ConfigError(
            f"{where}: field 'platform': {config.platform!r} is not supported; use one of {every}"
        )
    for name in known:
        if (version_dir / _filename(name)).is_file():
            return _load(name)
    files = sorted(_filename(n) for n in known)
    raise ConfigError(f"{version_dir}: no model file in this version directory (looked for {files})")


def expand_instances(config: ModelConfig, gpu_available: bool, where: str) -> list[Instance]:
    """The instances a config's ``instance_group`` asks for, as Triton places them:
    ``count`` per group, or per listed GPU for a ``KIND_GPU`` group; ``KIND_AUTO`` is a GPU
    when the backend has one, else the CPU. Names are ``<group name>_<n>`` (the group name
    defaults to ``<model>_<group index>``). Raises ConfigError for what cannot be placed."""
    out: list[Instance] = []
    for gi, group in enumerate(config.instance_group or (InstanceGroup(),)):
        kind = group.kind
        if kind == "KIND_AUTO":
            kind = "KIND_GPU" if gpu_available else "KIND_CPU"
        field = f"{where}: field 'instance_group[{gi}]'"
        if kind == "KIND_GPU" and not gpu_available:
            raise ConfigError(
                f"{field}: kind KIND_GPU, but the {config.backend or 'model'}'s backend sees no GPU here; "
                "use KIND_CPU, or KIND_AUTO to take a GPU only when there is one"
            )
        if kind == "KIND_CPU" and group.gpus:
            raise ConfigError(f"{field}: gpus {list(group.gpus)} apply to KIND_GPU groups only")
        base = group.name or f"{config.name}_{gi}"
        devices = group.gpus or ((0,) if kind == "KIND_GPU" else (-1,))
        n = 0
        for device in devices:
            for _ in range(group.count):
                out.append(Instance(f"{base}_{n}", kind, device))
                n += 1
    names = [i.name for i in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(
            f"{where}: field 'instance_group': instance names {dupes} repeat; name each group once"
        )
    return out
