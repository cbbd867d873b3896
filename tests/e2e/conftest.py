"""Real servers in subprocesses, on free loopback ports, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from milliserve.testing import ServerProcess


@pytest.fixture(scope="module")
def server(example_repo: Path) -> Iterator[ServerProcess]:
    """The example repository served with default settings."""
    with ServerProcess(example_repo) as proc:
        yield proc
