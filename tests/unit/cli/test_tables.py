"""The commands' tables when their output is piped (a log, a CI job, the tutorial's test):
rich assumes 80 columns there, and cut a loaded server's budget report to "seriali…" and
"-227.8…"."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from milliserve.budget import stage_report as budget
from milliserve.budget.stage_report import BudgetReport, StageRow
from milliserve.cli.budget_cmd import _budget_report

STAGES = ("parse", "preprocess", "queue", "infer", "postprocess", "serialize")


def test_a_piped_budget_report_keeps_every_cell_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a loaded server: wide numbers in every column
    rows = [StageRow(s, 1_234_567, 105.123, 150.456, 242.861, 15.0) for s in STAGES]
    slow = BudgetReport("sentiment_pipeline_of_a_long_name", 50.0, rows)

    def fake(url: str, model: str, metrics_url: Any = None) -> BudgetReport:
        return slow

    monkeypatch.setattr(budget, "budget_report", fake)
    args = argparse.Namespace(
        url="http://127.0.0.1:1", model="m", metrics_url=None, plot=None, json=None, fail_over=False
    )
    assert _budget_report(args) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for stage in STAGES:
        assert f" {stage} " in out
    assert out.count("-227.861") == len(STAGES) and out.count("1,234,567") == len(STAGES)
