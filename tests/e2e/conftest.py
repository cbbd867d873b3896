"""Real servers in subprocesses, on free loopback ports, stopped by PID."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from milliserve.testing import ServerProcess


@pytest.fixture(scope="module")
def server(example_repo: Path) -> Iterator[ServerProcess]:
    """The example repository served with default settings."""
    with ServerProcess(example_repo) as proc:
        yield proc


@pytest.fixture(scope="module")
def llm_server(llm_repo: Path) -> Iterator[ServerProcess]:
    """The smollm2 example (generative, llama_cpp backend) served with default settings."""
    with ServerProcess(llm_repo) as proc:
        yield proc


@pytest.fixture(autouse=True)
def collect_clients_on_the_main_thread() -> Iterator[None]:
    """tritonclient.http's client closes its gevent pool in ``__del__``; if the garbage
    collector happens to run that on another thread (a test's thread pool), gevent raises.
    Collecting after each test keeps it on the main thread."""
    yield
    gc.collect()


EdgeBuild = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def edge_build() -> EdgeBuild:
    """``milliserve edge build TARGET --out OUT [extra...]`` as a user runs it."""

    def build(target: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "milliserve", "edge", "build", str(target), "--out", str(out), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)

    return build


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's headless Chromium (a Playwright browser context), for the edge tests."""
    pytest.importorskip("playwright.sync_api", reason="the [edge] extra (playwright) is needed")
    from tests.support.browser import chromium

    with chromium() as context:
        yield context
