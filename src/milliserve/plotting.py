"""matplotlib for the commands that draw (``bench --plot``, ``budget report --plot``,
``optimize``'s Pareto plot): imported when a plot is asked for, with the Agg backend (no
screen), and a clear error naming the extra to install when it is missing."""

from __future__ import annotations

from typing import Any

from milliserve.errors import MissingDependencyError

__all__ = ["pyplot"]


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot``, or MissingDependencyError saying how to get it for ``what``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError(
            f"{what} needs matplotlib, which is not installed: pip install 'milliserve[bench]'"
        ) from None
    return plt
