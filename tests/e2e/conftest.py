"""Real servers in subprocesses, on free loopback ports, stopped by PID."""

from __future__ import annotations

import gc
from collections.abc import Iterator
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
