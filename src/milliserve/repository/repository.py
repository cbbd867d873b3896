"""Discovery of a Triton-style model repository: ``<repo>/<model>/<version>/model.onnx``."""

from __future__ import annotations

import re
from pathlib import Path

from milliserve.config.model_config import ModelConfig, load_model_config
from milliserve.errors import ConfigError, NotFoundError

__all__ = ["Repository", "valid_model_name", "versions_in"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def valid_model_name(name: str) -> bool:
    """Whether ``name`` may name a model folder that is not in the repository (a load with
    override files): letters, digits, ``_ . -``, at most 128, not starting with a dot."""
    return bool(_NAME.fullmatch(name))


def versions_in(model_dir: Path) -> list[int]:
    """Numeric version folders of a model folder, ascending."""
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


class Repository:
    """A folder of model folders. Reads the disk on each call, so that a model added
    while the server runs can be loaded through the repository API."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise ConfigError(f"model repository {root} is not a directory")
        self.root = root.resolve()

    def model_names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))

    def model_dir(self, name: str) -> Path:
        # Only names listed in the repository are accepted, so a name like "../etc" can't escape.
        # The message names neither the repository's path nor its other models: clients see it.
        if name not in self.model_names():
            raise NotFoundError(f"model {name!r} is not in the model repository")
        return self.root / name

    def relative(self, message: str) -> str:
        """``message`` with the repository's absolute path taken out (paths read from its
        root, e.g. ``fraud/config.pbtxt``), for what clients see: they need not learn where
        the server keeps its files."""
        return message.replace(f"{self.root}/", "").replace(str(self.root), ".")

    def versions(self, name: str) -> list[int]:
        """Numeric version folders of a model, ascending."""
        return versions_in(self.model_dir(name))

    def read_config(self, name: str) -> ModelConfig | None:
        return load_model_config(self.model_dir(name))
