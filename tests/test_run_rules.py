"""The suite's own rules (tests/conftest.py), run on a small suite of their own: under CI a
package skipped by ``pytest.importorskip`` is a failure (the test command installs every
package the suite imports), elsewhere a skip; other skips stay skips; and each run builds
into a cache of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

IN_A_TEST = """
import os

import pytest


@pytest.fixture
def needs_a_package():
    pytest.importorskip("no_such_package_milliserve")


def test_needs_a_package(needs_a_package):
    pass


def test_skips_for_a_reason_of_its_own():
    pytest.skip("this machine has no GPU")


def test_has_a_cache_of_its_own():
    assert os.environ["MILLISERVE_CACHE"] != os.environ["CALLER_CACHE"]
    with open(os.environ["CACHE_RECORD"], "a") as f:
        f.write(os.environ["MILLISERVE_CACHE"] + "\\n")
"""

AT_MODULE_LEVEL = """
import pytest

pytest.importorskip("no_such_package_milliserve")


def test_never_runs():
    pass
"""


def _pytest(tmp_path: Path, ci: str | None, *files: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "conftest.py").write_text(CONFTEST.read_text())
    for name, text in files:
        (suite / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MILLISERVE_TEST_CACHE")}
    env["CALLER_CACHE"] = env.get("MILLISERVE_CACHE", "")
    env["CACHE_RECORD"] = str(tmp_path / "caches.txt")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-c", os.devnull, str(suite)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_under_ci_a_missing_package_fails_and_other_skips_stay(tmp_path: Path) -> None:
    r = _pytest(tmp_path, "true", ("test_in_a_test.py", IN_A_TEST))
    assert r.returncode == 1, r.stdout
    # the skip came from a fixture: a failure in setup, which pytest reports as an error
    assert "ERROR suite/test_in_a_test.py::test_needs_a_package" in r.stdout
    assert "could not import 'no_such_package_milliserve'" in r.stdout
    assert "this skip would hide a broken install" in r.stdout
    assert "SKIPPED [1] suite/test_in_a_test.py" in r.stdout and "this machine has no GPU" in r.stdout
    assert "1 passed, 1 skipped, 1 error" in r.stdout


def test_under_ci_a_module_skipped_whole_fails(tmp_path: Path) -> None:
    r = _pytest(tmp_path, "true", ("test_at_module_level.py", AT_MODULE_LEVEL))
    assert r.returncode != 0, r.stdout
    assert "ERROR" in r.stdout and "this skip would hide a broken install" in r.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_elsewhere_a_missing_package_is_a_skip(tmp_path: Path, ci: str | None) -> None:
    r = _pytest(tmp_path, ci, ("test_in_a_test.py", IN_A_TEST), ("test_at_module_level.py", AT_MODULE_LEVEL))
    assert r.returncode == 0, r.stdout
    assert "1 passed, 3 skipped" in r.stdout


def test_each_run_has_a_cache_of_its_own_and_leaves_none_behind(tmp_path: Path) -> None:
    for _ in range(2):
        r = _pytest(tmp_path, None, ("test_in_a_test.py", IN_A_TEST))
        assert r.returncode == 0, r.stdout
    caches = (tmp_path / "caches.txt").read_text().split()
    assert len(caches) == 2 and caches[0] != caches[1]
    assert not any(Path(c).exists() for c in caches)
