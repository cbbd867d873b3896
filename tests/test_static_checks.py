"""The habits in pyproject.toml hold: ruff lint and format, and mypy --strict on src/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_lint_and_format() -> None:
    lint = run("ruff", "check", "src", "tests", "benchmarks")
    assert lint.returncode == 0, lint.stdout
    fmt = run("ruff", "format", "--check", "src", "tests", "benchmarks")
    assert fmt.returncode == 0, fmt.stdout


def test_mypy_strict() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout
