"""One server's metrics from several workers' (``serve --workers N``): Prometheus text
merged under a ``worker`` label. (Their Triton statistics are summed by
``milliserve.runtime.stats.merge_statistics``.)"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["merge_metrics"]


def _with_label(line: str, worker: int) -> str:
    label = f'worker="{worker}"'
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.find("}", brace)
        inner = line[brace + 1 : close]
        return f"{line[: brace + 1]}{label}{',' if inner else ''}{line[brace + 1 :]}"
    return f"{line[:space]}{{{label}}}{line[space:]}" if space != -1 else line


def merge_metrics(texts: Iterable[tuple[int, bytes]]) -> bytes:
    """Prometheus text from several workers as one exposition: each family's HELP and TYPE
    once, then every worker's samples with a ``worker`` label."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for worker, text in texts:
        family = ""
        for line in text.decode().splitlines():
            if not line:
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family not in heads:
                    order.append(family)
                    heads[family], samples[family] = [], []
                if line not in heads[family]:
                    heads[family].append(line)
            elif line.startswith("#"):
                continue
            else:
                samples.setdefault(family, []).append(_with_label(line, worker))
                if family not in heads:
                    order.append(family)
                    heads[family] = []
    out = []
    for family in order:
        out += heads[family] + samples.get(family, [])
    return ("\n".join(out) + "\n").encode()
