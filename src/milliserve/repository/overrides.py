"""A load request's overrides (Triton's model repository extension): ``config``, a model
configuration in Triton's JSON used instead of the model's own, and ``file:<path>``
parameters, the files of a model folder sent with the request.

Files are written to a private temporary folder (mode 0700) that holds that one model;
it is removed when the model is unloaded or loaded again, and when the server stops.
Every path is checked before anything is written: relative, no ``..``, no empty or
hidden parts; at most MAX_FILES files. Their bytes are already bounded by the request
size limits of the front ends. A file the filesystem refuses (a name longer than it
allows, say) fails the load as Triton's does: "failed to poll from model repository".
"""

from __future__ import annotations

import base64
import binascii
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milliserve.config.model_config import ModelConfig, config_from_json
from milliserve.errors import BackendError, ConfigError, InvalidInputError, RequestError, shown

__all__ = ["MAX_FILES", "LoadOverride", "parse_override"]

MAX_FILES = 128
_PARAMS = ("config",)


@dataclass(slots=True)
class LoadOverride:
    """What a load request brings: a config, and perhaps the model's files."""

    config: ModelConfig
    files: dict[str, bytes]
    folder: Path | None = None  # where the files were written (a model folder named as the model)

    def write(self, name: str) -> Path:
        """Write the files into a fresh private folder; returns the model's folder in it."""
        root = Path(tempfile.mkdtemp(prefix="milliserve-override-"))  # 0700, whatever the umask
        model_dir = root / name
        try:
            model_dir.mkdir()
            for rel, data in self.files.items():
                path = model_dir / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "xb") as f:
                    f.write(data)
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise BackendError(
                f"failed to load {name!r}: failed to poll from model repository: cannot write the "
                f"override file {shown(exc.filename or '')}: {exc.strerror}"
            ) from None
        self.folder = model_dir
        return model_dir

    def discard(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder.parent, ignore_errors=True)
            self.folder = None


def _check_path(name: str, rel: str) -> str:
    parts = rel.split("/")
    bad = (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or any(p in ("", ".", "..") or p.startswith(".") for p in parts)
    )
    if bad:
        raise InvalidInputError(
            f"failed to load {name!r}: override file {shown('file:' + rel)} must be a relative path "
            "inside the model folder, like file:1/model.onnx"
        )
    return "/".join(parts)


def _bytes(name: str, key: str, value: Any) -> bytes:
    if isinstance(value, bytes):  # gRPC bytes_param
        return value
    if isinstance(value, str):  # HTTP: base64
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise InvalidInputError(f"failed to load {name!r}: parameter {shown(key)} must be base64-encoded bytes")


def parse_override(name: str, parameters: dict[str, Any]) -> LoadOverride | None:
    """The override a load request's parameters describe, or None when they have none.
    RequestError for unknown parameters, files without a config, bad paths, an invalid config."""
    files_in = {k: v for k, v in parameters.items() if k.startswith("file:")}
    unknown = sorted(set(parameters) - set(files_in) - set(_PARAMS))
    if unknown:
        raise RequestError(f"load model {name!r}: parameters {unknown} are not supported")
    text = parameters.get("config")
    if text is None:
        if files_in:
            raise InvalidInputError(
                f"failed to load {name!r}: file: overrides need a 'config' parameter (the model "
                "configuration of the override folder)"
            )
        return None
    if not isinstance(text, str):
        raise InvalidInputError(f"failed to load {name!r}: parameter 'config' must be a JSON string")
    if len(files_in) > MAX_FILES:
        raise InvalidInputError(
            f"failed to load {name!r}: {len(files_in)} override files; at most {MAX_FILES}"
        )
    files: dict[str, bytes] = {}
    for key, value in files_in.items():
        rel = _check_path(name, key.removeprefix("file:"))
        if rel in files:
            raise InvalidInputError(f"failed to load {name!r}: override file {shown(key)} is given twice")
        files[rel] = _bytes(name, key, value)
    try:
        config = config_from_json(text, name, "config override")
    except ConfigError as exc:
        raise InvalidInputError(f"failed to load {name!r}: invalid config override: {exc.message}") from None
    return LoadOverride(config, files)
