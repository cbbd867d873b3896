"""The optimisation report: ``report.json`` (everything), ``report.md`` (the table, the
choice and why, the head-to-head re-timing, the accuracy-aware searches) and
``pareto.png`` (quality against latency, labels that do not overlap, the shipped
variant marked)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milliserve.errors import MissingDependencyError
from milliserve.optimize.measure import BATCHES
from milliserve.optimize.select import latency_parts
from milliserve.plotting import pyplot

__all__ = ["OptimizeReport", "holds_for", "write_reports"]

log = logging.getLogger(__name__)


@dataclass
class OptimizeReport:
    source: str
    metric: str
    tolerance: float
    latency_key: str
    cpu: dict[str, Any]
    threads: int
    reference: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    winner: str | None = None
    why: str = ""  # one sentence: why the winner, or why FP32
    pareto: list[str] = field(default_factory=list)
    output: str | None = None
    batches: list[int] = field(default_factory=lambda: list(BATCHES))
    finalists: list[str] = field(default_factory=list)
    final_rounds: int = 0
    # each input's shape per item (after the batch dimension) in the timing runs: the eval
    # set's rows, so a speed-up holds for inputs of that size (a sequence model's length)
    item_shapes: dict[str, list[int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def row(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["name"] == name and not r["skipped"]), None)


def _strict(value: Any) -> Any:
    """NaN (no interval, no quality for a ranking step) as null: report.json stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _ci(r: dict[str, Any]) -> str:
    p, lo, hi = r.get("speedup", math.nan), r.get("speedup_low", math.nan), r.get("speedup_high", math.nan)
    if math.isnan(p):
        return "-"
    return f"{p:.2f}× ({lo:.2f}–{hi:.2f})" if not math.isnan(lo) else f"{p:.2f}×"


def _shapes(shapes: dict[str, list[int]]) -> str:
    """', each input [batch, ...]' as timed: the figures hold for inputs of these sizes."""
    if not shapes:
        return ""
    each = ", ".join(
        f"{name} [batch, {', '.join(map(str, dims))}]" if dims else f"{name} [batch]"
        for name, dims in shapes.items()
    )
    return f" ({each}; the speed-ups hold for inputs of that size)"


def holds_for(cpu: dict[str, Any]) -> str:
    """The sentence saying which CPU features the report's figures hold for: INT8 and BF16
    kernels (ONNX Runtime's, OpenVINO's) choose their code by them, so a quantized
    variant's accuracy as well as its speed can differ on a CPU with other features."""
    flags = " ".join(cpu.get("flags") or []) or "none of AVX2, AVX-512, VNNI, BF16 or AMX"
    return (
        f"Accuracy and speed hold for a CPU with these features: {flags}. Quantized kernels "
        "choose their code by them (VNNI, AVX-512, AMX), so on a CPU with other features a "
        "variant's accuracy and speed can differ: run optimize there before trusting them."
    )


def write_reports(report: OptimizeReport, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.json").write_text(json.dumps(_strict(report.as_dict()), indent=2, default=str))
    big = max(report.batches)
    q, k = latency_parts(report.latency_key)  # the columns follow what was ranked on
    lines = [
        f"# Optimisation report: {report.source}",
        "",
        f"CPU: {report.cpu['model']} ({report.cpu['cores']} cores, flags {' '.join(report.cpu['flags'])}); "
        f"{report.threads} inference thread(s); variants timed round-robin in one process, "
        f"on the evaluation set's rows{_shapes(report.item_shapes)}.",
        f"Metric: {report.metric} (FP32 {report.reference:.4f}), tolerance {report.tolerance}; "
        f"ranked on {report.latency_key}; shipped: **{report.winner or 'nothing'}**. {report.why}.",
        "",
        holds_for(report.cpu),
        "",
        f"Speed-up is FP32's latency over the variant's at batch {k} (p{q:.0f}) with its 95% bootstrap "
        "interval over the timing rounds; finalists (†) were re-timed head to head in "
        f"{report.final_rounds} more interleaved rounds and show those figures.",
        "",
        f"| variant | runtime | quality | Δ vs FP32 | p50 b{k} µs | p99 b{k} µs | speed-up (95% CI) "
        f"| p50 b{big} µs | b{big} items/s | size KiB | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        if r["skipped"]:
            why = " ".join(
                str(r["skipped"]).split()
            )  # one line: a table row cannot hold a traceback's breaks
            lines.append(f"| {r['name']} | - | - | - | - | - | - | - | - | - | skipped: {why} |")
            continue
        mark = (" **shipped**" if r["name"] == report.winner else "") + (
            " †" if r["name"] in report.finalists else ""
        )
        serve = "" if r.get("servable", True) else " (reference, not servable)"
        lines.append(
            f"| {r['name']}{mark} | {r.get('runtime', '')}{serve} | {r['quality']:.4f} | {r['delta']:+.4f} | "
            f"{r.get(f'p50_b{k}_us', 0):.1f} | {r.get(f'p99_b{k}_us', 0):.1f} | {_ci(r)} | "
            f"{r.get(f'p50_b{big}_us', 0):.1f} | {r.get(f'throughput_b{big}', 0):,.0f} | "
            f"{r['size_bytes'] / 1024:,.0f} | {r['note']} |"
        )
    measured = [r for r in report.rows if not r["skipped"] and r.get("measures")]
    if measured:
        lines += [
            "",
            "### Embedding quality",
            "",
            "Each variant's vectors of the evaluation texts against FP32's: the mean cosine, and "
            "recall@10 of exact search over FP32's vectors of the same texts (each text a query, its "
            "own row left out) against FP32's own neighbours. Quality is the lower of the cosine and "
            "1 - (1 - recall@10) / 3: within a tolerance t only with cosine >= 1 - t and recall@10 "
            ">= 1 - 3t.",
            "",
            "| variant | cosine | recall@10 | quality |",
            "|---|---|---|---|",
        ]
        for r in measured:
            m = r["measures"]
            lines.append(
                f"| {r['name']} | {m['cosine']:.4f} | {m['recall_at_10']:.4f} | {m['quality']:.4f} |"
            )
    searched = [r for r in report.rows if r.get("search")]
    for r in searched:
        lines += [
            "",
            f"### Accuracy-aware search: {r['name']}",
            "",
            "| step | kept in FP32 | quality | s |",
            "|---|---|---|---|",
        ]
        for s in r["search"]:
            shown = "-" if math.isnan(s["quality"]) else f"{s['quality']:.4f}"
            lines.append(f"| {s['what']} | {s['kept_fp32']} | {shown} | {s['seconds']:.1f} |")
    (output / "report.md").write_text("\n".join(lines) + "\n")
    try:
        _plot(report, output / "pareto.png")
    except MissingDependencyError as exc:  # the plot is a picture of report.md, not the result
        log.warning("no pareto.png: %s", exc.message)


def _place_labels(ax: Any, points: list[tuple[float, float, str]], fig: Any) -> list[Any]:
    """Annotate each point at the nearest offset whose box stays inside the axes and
    overlaps no label placed so far; labels of crowded points stack above and below them,
    with a leader line back to their point."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    from matplotlib.transforms import Bbox

    # markers count as taken: a label is never written over another variant's point
    placed: list[Any] = [
        Bbox.from_extents(px - 4, py - 4, px + 4, py + 4)
        for px, py in (ax.transData.transform((x, y)) for x, y, _ in points)
    ]
    texts = []
    near = sorted(range(-110, 111, 11), key=abs)
    far = sorted(range(-220, 221, 11), key=abs)
    # beside the point first (above or below it), then further out sideways
    offsets = [(dx, dy) for dx in (6, -6) for dy in near] + [
        (dx, dy) for dy in far for dx in (48, -48, 96, -96, 6, -6)
    ]
    for x, y, label in sorted(points, key=lambda p: (p[0], p[1])):
        chosen = None
        for dx, dy in offsets:
            t = ax.annotate(
                label,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=7,
                ha="left" if dx >= 0 else "right",
                va="center",
                arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "grey"}
                if abs(dy) > 8 or abs(dx) > 6
                else None,
            )
            t.update_positions(renderer)
            box = Text.get_window_extent(t, renderer)  # the words only: leader lines may cross
            fits = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            if fits and not any(box.overlaps(b) for b in placed):
                chosen = t
                placed.append(box)
                break
            t.remove()
        if chosen is None:  # nowhere free: a plain label rather than none
            chosen = ax.annotate(label, (x, y), xytext=(6, 0), textcoords="offset points", fontsize=7)
            chosen.update_positions(renderer)
            placed.append(Text.get_window_extent(chosen, renderer))
        texts.append(chosen)
    return texts


def _plot(report: OptimizeReport, path: Path) -> None:
    plt = pyplot("milliserve optimize's Pareto plot")
    from matplotlib.ticker import FuncFormatter, LogLocator

    key = report.latency_key
    rows = [r for r in report.rows if not r["skipped"] and key in r]
    fig, ax = plt.subplots(figsize=(10, 6))
    ax.set_xscale("log")
    for r in rows:
        front = r["name"] in report.pareto
        ax.scatter(r[key], r["quality"], s=40 if front else 20, c="C3" if front else "C0", zorder=3)
    shipped = report.row(report.winner) if report.winner else None
    if shipped is not None and key in shipped:
        ax.scatter(
            shipped[key],
            shipped["quality"],
            s=260,
            marker="*",
            c="gold",
            edgecolors="black",
            zorder=4,
            label=f"shipped: {shipped['name']}",
        )
    front_rows = sorted((r for r in rows if r["name"] in report.pareto), key=lambda r: r[key])
    ax.plot([r[key] for r in front_rows], [r["quality"] for r in front_rows], "C3--", label="Pareto front")
    ax.axhline(report.reference - report.tolerance, color="grey", lw=0.8, ls=":", label="FP32 - tolerance")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel(f"{key} (µs, log scale)")
    ax.set_ylabel(report.metric)
    ax.set_title("Quality against latency")
    ax.grid(True, which="major", lw=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.canvas.draw()
    _place_labels(ax, [(r[key], r["quality"], r["name"]) for r in rows], fig)
    fig.savefig(path, dpi=110)
    plt.close(fig)
