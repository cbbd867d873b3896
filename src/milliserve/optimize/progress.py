"""Progress reporting for long optimisation steps, decoupled from any terminal library:
the CLI passes a rich-backed one, a notebook or a test passes nothing (or its own)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any, Protocol

__all__ = ["Progress", "RichProgress", "hushed", "quiet"]


class Progress(Protocol):
    def stage(self, name: str) -> None:
        """A new step has started (building a variant, scoring, timing)."""

    def steps(self, name: str, total: int) -> Any:
        """A context manager yielding ``advance(n=1)`` for a step with ``total`` units."""


class _Quiet:
    def stage(self, name: str) -> None:
        pass

    @contextmanager
    def steps(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        def advance(n: int = 1) -> None:
            pass

        yield advance


quiet: Progress = _Quiet()


class RichProgress:
    """A status line for stages and a progress bar per counted step, on stderr."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)

    def stage(self, name: str) -> None:
        self.console.log(name)

    @contextmanager
    def steps(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        from rich.progress import BarColumn, MofNCompleteColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        with Bar(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        ) as bar:
            task = bar.add_task(name, total=total)

            def advance(n: int = 1) -> None:
                bar.advance(task, n)

            yield advance


@contextmanager
def hushed() -> Iterator[None]:
    """onnxruntime.quantization and NNCF warn through the root logger (one line per LayerNorm
    weight) and print their calibration steps; keep them out of the user's progress display."""
    loggers = [logging.getLogger(), logging.getLogger("nncf")]  # NNCF logs through its own handler
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as sink, redirect_stdout(sink):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
