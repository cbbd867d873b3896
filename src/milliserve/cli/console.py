"""The console the commands print their tables to."""

from __future__ import annotations

from typing import Any

__all__ = ["table_console"]

# wide enough for every table the commands print
_PIPED_WIDTH = 180


def table_console() -> Any:
    """A rich Console at the terminal's width; when the output is piped (a log, a CI job,
    a test) rich would assume 80 columns and cut the cells of a wide table short
    ("seriali…", "-227.8…"), so a piped table gets room for all of its cells."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=_PIPED_WIDTH)
