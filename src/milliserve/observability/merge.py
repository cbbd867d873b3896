"""One server's view of several workers' numbers (``serve --workers N``): Prometheus text
merged under a ``worker`` label, Triton statistics summed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["merge_metrics", "merge_statistics"]


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


def _merge(a: Any, b: Any, key: str = "") -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        for k, v in b.items():
            merged[k] = _merge(merged[k], v, k) if k in merged else v
        return merged
    if isinstance(a, list) and isinstance(b, list):
        return _merge_list(a, b)
    if key == "last_inference":
        return max(a, b)
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return a + b
    return a


def _ident(item: Any) -> Any:
    if isinstance(item, dict):
        for keys in (("name", "version"), ("batch_size",)):
            if all(k in item for k in keys):
                return tuple(item[k] for k in keys)
    return None


def _merge_list(a: list[Any], b: list[Any]) -> list[Any]:
    out = list(a)
    index = {_ident(x): i for i, x in enumerate(out) if _ident(x) is not None}
    for item in b:
        ident = _ident(item)
        if ident is not None and ident in index:
            out[index[ident]] = _merge(out[index[ident]], item)
        else:
            if ident is not None:
                index[ident] = len(out)
            out.append(item)
    return out


def merge_statistics(per_worker: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Triton's model statistics of several workers as one server's: counts and
    nanoseconds summed per model version (and per batch size), the latest last_inference."""
    merged: list[dict[str, Any]] = []
    for stats in per_worker:
        merged = _merge_list(merged, stats)
    return merged
