"""``milliserve budget report``: each stage's p50/p95/p99 from a server's Prometheus
histograms (``milliserve_stage_duration_seconds``) against the model's budget, the
slack left, the stage that is over, and a waterfall PNG.

Percentiles come from histogram buckets (interpolated inside a bucket), so they are as
fine as the buckets: 50, 100, 250, 500 µs, 1, 2.5, 5, 10, 25, 50 ms, ...
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from milliserve.errors import ConfigError
from milliserve.observability.timing import STAGES
from milliserve.plotting import pyplot

__all__ = ["BudgetReport", "StageRow", "budget_report", "percentile_from_buckets", "plot_waterfall"]

METRIC = "milliserve_stage_duration_seconds"


@dataclass
class StageRow:
    stage: str
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    budget_ms: float | None

    @property
    def slack_ms(self) -> float | None:
        return None if self.budget_ms is None else self.budget_ms - self.p99_ms

    @property
    def over(self) -> bool:
        return self.budget_ms is not None and self.p99_ms > self.budget_ms


@dataclass
class BudgetReport:
    model: str
    p99_budget_ms: float | None
    rows: list[StageRow] = field(default_factory=list)

    @property
    def p99_sum_ms(self) -> float:
        """Sum of the stage p99s: an upper bound of the end-to-end p99 the stages allow."""
        return sum(r.p99_ms for r in self.rows)

    @property
    def over_budget(self) -> list[str]:
        return [r.stage for r in self.rows if r.over]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "p99_budget_ms": self.p99_budget_ms,
            "p99_sum_ms": self.p99_sum_ms,
            "over_budget": self.over_budget,
            "stages": [{**r.__dict__, "slack_ms": r.slack_ms, "over": r.over} for r in self.rows],
        }


def percentile_from_buckets(buckets: list[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile (0..1) from cumulative ``(upper bound, count)`` buckets, linear
    inside the bucket it falls in (Prometheus' histogram_quantile)."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return 0.0
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound  # beyond the last finite bucket: report its bound
            width = count - lower_count
            frac = (rank - lower_count) / width if width > 0 else 1.0
            return lower_bound + (bound - lower_bound) * frac
        lower_bound, lower_count = bound, count
    return lower_bound


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as exc:
        raise ConfigError(
            f"GET {url} answered {exc.code}: {exc.read().decode(errors='replace')[:200]}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigError(f"cannot reach {url}: {exc}") from None


def _metrics_text(base: str, metrics_url: str | None) -> tuple[str, str]:
    """(URL, text) of the server's Prometheus metrics: ``metrics_url``, or else the server's
    own HTTP port (milliserve serves /metrics there too), or else the same host on 8002."""
    if metrics_url is not None:
        return metrics_url, _get(metrics_url)
    host = base.split("://", 1)[1].rsplit(":", 1)[0]
    tried = []
    for candidate in (f"{base}/metrics", f"http://{host}:8002/metrics"):
        try:
            return candidate, _get(candidate)
        except ConfigError as exc:
            tried.append(exc.message)
    raise ConfigError("no Prometheus metrics found (give --metrics-url): " + "; ".join(tried))


def budget_report(url: str, model: str, metrics_url: str | None = None) -> BudgetReport:
    """Read the model's budget from ``url`` (its OIP config) and its stage histograms from
    ``metrics_url`` (default: the server's own /metrics, else port 8002 of the same host).
    Raises ConfigError naming what failed."""
    base = url.rstrip("/")
    if "://" not in base:
        base = f"http://{base}"
    config = json.loads(_get(f"{base}/v2/models/{model}/config"))
    budget = config.get("budget") or {}
    stages_budget: dict[str, float] = budget.get("stages", {})
    metrics_url, text = _metrics_text(base, metrics_url)
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for s in family.samples:
            if s.name == METRIC + "_bucket" and s.labels.get("model") == model:
                stage = s.labels["stage"]
                bound = float(s.labels["le"])
                rows = buckets.setdefault(stage, [])
                found = next((i for i, (b, _) in enumerate(rows) if b == bound), None)
                if found is None:
                    rows.append((bound, s.value))
                else:  # several versions: add them up
                    rows[found] = (bound, rows[found][1] + s.value)
    if not buckets:
        raise ConfigError(
            f"{metrics_url} has no {METRIC} samples for model {model!r}: is it a milliserve server "
            "that has answered requests for this model?"
        )
    order = [s for s in STAGES if s in buckets or s in stages_budget] + sorted(set(buckets) - set(STAGES))
    report = BudgetReport(model, budget.get("p99_ms"))
    for stage in order:
        b = sorted(buckets.get(stage, []))
        report.rows.append(
            StageRow(
                stage,
                int(b[-1][1]) if b else 0,
                percentile_from_buckets(b, 0.50) * 1e3,
                percentile_from_buckets(b, 0.95) * 1e3,
                percentile_from_buckets(b, 0.99) * 1e3,
                stages_budget.get(stage),
            )
        )
    return report


def plot_waterfall(report: BudgetReport, path: Path) -> Path:
    """A waterfall of the stages' p99 against their allocations, in request order."""
    plt = pyplot("milliserve budget report --plot")

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(report.rows) + 1.8))
    start_used = start_budget = 0.0
    for i, r in enumerate(report.rows):
        y = len(report.rows) - i
        if r.budget_ms is not None:
            ax.barh(
                y + 0.18,
                r.budget_ms,
                left=start_budget,
                height=0.32,
                color="0.85",
                label="budget" if i == 0 else None,
            )
            start_budget += r.budget_ms
        colour = "C3" if r.over else "C0"
        ax.barh(
            y - 0.18, r.p99_ms, left=start_used, height=0.32, color=colour, label="p99" if i == 0 else None
        )
        ax.text(start_used + r.p99_ms, y - 0.18, f" {r.p99_ms:.2f} ms", va="center", fontsize=8)
        start_used += r.p99_ms
    ax.set_yticks(range(len(report.rows), 0, -1), [r.stage for r in report.rows])
    if report.p99_budget_ms:
        ax.axvline(
            report.p99_budget_ms, color="C3", ls="--", lw=1, label=f"p99 budget {report.p99_budget_ms:g} ms"
        )
    ax.set_xlabel("milliseconds (stages stacked in request order)")
    over = ", ".join(report.over_budget) or "none"
    ax.set_title(f"{report.model}: latency budget (over budget: {over})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
