"""What a cached example build was built with, so that a build is reused only where it
would come out the same.

A cached build (``$MILLISERVE_CACHE/<name>_<key>/``) is keyed by its recipe and by the
environment it was built in: the versions of the packages that shape what it produces
(a quantizer that cannot be imported is a variant skipped, a newer ONNX Runtime fuses
differently) and the CPU features that ``optimize`` chooses by (with VNNI its dynamic
INT8 variant has signed weights, and its timings pick the winner). Its ``manifest.json``
records the same, with what the build produced: each variant built or skipped, and why.
A build whose manifest does not match the environment it would be used in is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from milliserve.optimize.cpu import cpu_info

__all__ = ["MANIFEST", "building", "built_with", "cache_key", "read_manifest", "write_manifest"]

MANIFEST = "manifest.json"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def built_with(packages: Iterable[str]) -> dict[str, Any]:
    """The environment a build depends on: each of ``packages``' installed version (None
    when it is not installed) and the CPU features ``optimize`` reports (``avx2``,
    ``avx512f``, ``avx512_vnni``, ``amx_int8``, ...)."""
    flags = cpu_info().as_dict()["flags"]
    assert isinstance(flags, list)
    return {"packages": {p: _version(p) for p in sorted(packages)}, "cpu_flags": sorted(flags)}


def cache_key(recipe: dict[str, Any], environment: dict[str, Any]) -> str:
    """Twelve hex digits naming a build of ``recipe`` in ``environment``."""
    text = json.dumps({"recipe": recipe, "built_with": environment}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_manifest(work: Path, environment: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of the finished build in ``work``, or None when there is none or it
    was built with something other than ``environment`` (then it must be built again)."""
    try:
        manifest = json.loads((work / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("built_with") != environment:
        return None
    return manifest


def write_manifest(work: Path, environment: dict[str, Any], **record: Any) -> dict[str, Any]:
    """Write ``work/manifest.json`` (the environment and ``record``) last, as the mark that
    the build finished; returns what was written."""
    manifest = {"built_with": environment, **record}
    tmp = work / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(work / MANIFEST)
    return manifest


@contextmanager
def building(work: Path) -> Iterator[None]:
    """Hold the cache folder's lock: two processes building at once (a test run beside a
    benchmark, say) would otherwise delete each other's intermediate files."""
    work.mkdir(parents=True, exist_ok=True)
    with (work.parent / f"{work.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
