"""A cached example build records what it was built with and is reused only where that
is the same; a build (or the demo) that lacks a package refuses with the command to run,
rather than build a different repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from milliserve.examples.build_record import built_with, cache_key, read_manifest, write_manifest
from milliserve.examples.sentiment_pipeline import PACKAGES, REQUIRED
from milliserve.optimize.cpu import cpu_info


def test_the_environment_names_package_versions_and_cpu_features() -> None:
    env = built_with(["numpy", "no-such-package-milliserve"])
    assert env["packages"]["numpy"] == np.__version__
    assert env["packages"]["no-such-package-milliserve"] is None  # recorded as missing
    assert env["cpu_flags"] == sorted(cpu_info().as_dict()["flags"])  # type: ignore[arg-type]


def test_the_key_changes_with_the_recipe_and_with_the_environment() -> None:
    env = {"packages": {"sympy": "1.14.0"}, "cpu_flags": ["avx2", "avx512f"]}
    key = cache_key({"recipe": 2}, env)
    assert len(key) == 12 and key == cache_key({"recipe": 2}, json.loads(json.dumps(env)))
    assert cache_key({"recipe": 3}, env) != key
    assert cache_key({"recipe": 2}, env | {"packages": {"sympy": None}}) != key
    assert cache_key({"recipe": 2}, env | {"cpu_flags": ["avx2"]}) != key


def test_a_manifest_is_read_back_only_in_the_environment_it_was_built_in(tmp_path: Path) -> None:
    env = {"packages": {"sympy": "1.14.0"}, "cpu_flags": ["avx2"]}
    assert read_manifest(tmp_path, env) is None  # nothing built yet
    written = write_manifest(tmp_path, env, shipped="int8_dynamic", variants={"m": {}})
    assert read_manifest(tmp_path, env) == written
    assert read_manifest(tmp_path, {**env, "cpu_flags": ["avx2", "avx512_vnni"]}) is None
    assert read_manifest(tmp_path, {**env, "packages": {"sympy": None}}) is None
    (tmp_path / "manifest.json").write_text("{not json")
    assert read_manifest(tmp_path, env) is None


def test_the_cached_sentiment_build_records_its_variants(example_repo: Path) -> None:
    """The suite's own build (in this run's cache): what it was built with, each variant's
    quality or why it was skipped, and the shipped INT8 variant the tutorial describes."""
    (path,) = Path(os.environ["MILLISERVE_CACHE"]).glob("sentiment_*/manifest.json")
    manifest = json.loads(path.read_text())
    assert manifest["built_with"] == built_with(PACKAGES)
    assert manifest["built_with"]["packages"]["sympy"] is not None
    variants = manifest["variants"]["sentiment_model"]
    assert "quality" in variants[REQUIRED] and "quality" in variants["fp32"]
    assert all("quality" in v or v["skipped"] for v in variants.values())
    assert manifest["shipped"] in variants and "quality" in variants[manifest["shipped"]]
    config = (example_repo / "sentiment_model" / "config.yaml").read_text()
    assert f"shipped: {manifest['shipped']}" in config


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which ``modules`` fail to import, with a cache of its own."""
    for module in modules:
        fake = tmp_path / "site" / module
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(f"raise ImportError('{module} is not installed here')\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "MILLISERVE_CACHE": str(tmp_path / "cache")}


def test_the_sentiment_build_refuses_without_sympy_before_any_work(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "milliserve",
            "examples",
            "build",
            str(tmp_path / "repo"),
            "--only",
            "sentiment",
        ],
        capture_output=True,
        text=True,
        env=_without(tmp_path, "sympy"),
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    assert "needs sympy" in r.stderr and "pip install 'milliserve[client]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not list((tmp_path / "cache").glob("sentiment_*/*.onnx"))  # nothing was built


def test_the_demo_refuses_naming_every_missing_package_and_the_command(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "milliserve", "demo", "--dir", str(tmp_path / "repo")],
        capture_output=True,
        text=True,
        env=_without(tmp_path, "sympy", "matplotlib"),
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    assert "milliserve demo needs packages that are not installed" in r.stderr
    assert "sympy" in r.stderr and "matplotlib" in r.stderr and "tritonclient" not in r.stderr
    assert "pip install 'milliserve[client]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "repo").exists()  # refused before building anything


def test_only_a_package_the_client_extra_installs_stops_the_sentiment_build() -> None:
    """The README's first command installs the client extra, not PyTorch: ``bert_fused``
    skipped for want of torch (ONNX Runtime's transformer optimizer imports it) is reported
    and the build goes on; a variant skipped for sympy stops it with the install command."""
    from milliserve.examples.sentiment_pipeline import client_package_missing

    assert not client_package_missing("ModuleNotFoundError: No module named 'torch'")
    assert not client_package_missing("ModuleNotFoundError: No module named 'torch.onnx'")
    assert not client_package_missing("no BERT-like attention found to fuse")
    assert client_package_missing("ModuleNotFoundError: No module named 'sympy'")
    assert client_package_missing("ImportError: cannot import name 'x' from partially initialized module")
