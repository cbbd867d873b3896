"""How many load-generating processes bench runs: one unless asked, and it says so.

On a 2-vCPU machine one client process per core took a core from the server it measured
(docs/bench.md, "Which clock is right"); these tests pin the default, not a latency."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from milliserve.bench.fake_server import fake_server_process
from milliserve.bench.run_report import client_line, print_report
from milliserve.bench.runner import DEFAULT_WORKERS, BenchConfig, client_workers, run_bench
from milliserve.cli.main import build_parser
from milliserve.errors import ConfigError


def test_the_default_is_one_process_and_an_explicit_count_is_kept() -> None:
    assert DEFAULT_WORKERS == 1
    assert client_workers(0) == 1
    assert client_workers(3) == 3
    with pytest.raises(ConfigError, match="--workers must be >= 0"):
        client_workers(-1)


def test_the_cli_leaves_the_choice_to_the_library_and_its_help_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    assert parser.parse_args(["bench", "http://127.0.0.1:1", "-m", "m"]).workers == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--help"])
    assert "default 1" in " ".join(capsys.readouterr().out.split())


def test_a_run_without_workers_uses_one_and_reports_it() -> None:
    with fake_server_process() as url:
        report = run_bench(
            BenchConfig(url=url, model="fake", concurrency=[2], duration_s=0.3, warmup_s=0.1, calibrate=False)
        )
    assert report.config.workers == 1
    doc = report.as_dict()
    assert doc["config"]["workers"] == 1 and doc["machine"]["client_workers"] == 1
    out = io.StringIO()
    print_report(report, Console(file=out, width=200))
    assert "client: 1 load-generating process (the default; --workers N for more)" in out.getvalue()


def test_an_explicit_count_is_reported_without_the_default_note() -> None:
    line = client_line({"client_workers": 2, "cores": 4})
    assert line.startswith("client: 2 load-generating processes on a 4-core machine")
    assert "default" not in line
