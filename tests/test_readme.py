"""The README's promises: its two commands exist, CI runs the test command, and the
main job works end to end (it is run here with fewer requests)."""

from __future__ import annotations

import re
from pathlib import Path

from milliserve.examples.demo import run_demo

ROOT = Path(__file__).resolve().parent.parent


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert "milliserve demo" in blocks[0] and "pip install" in blocks[0]
    assert blocks[1].strip() == "scripts/test"
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_main_job_runs_end_to_end(tmp_path: Path) -> None:
    lines: list[str] = []
    summaries = run_demo(tmp_path / "repo", requests=20, log=lines.append)
    assert [s.name for s in summaries] == [
        "fraud_mlp http binary",
        "fraud_mlp http json",
        "fraud_mlp grpc",
        "minilm grpc",
        "fraud pipeline http",
        "sentiment pipeline grpc",
    ]
    assert all(s.p50_ms > 0 and s.p99_ms >= s.p50_ms and s.throughput > 0 for s in summaries)
    assert any("cosine" in line for line in lines)
    # which variant of the sentiment model serves is said, and where the report is
    assert any(line.startswith("sentiment_model: optimize shipped ") for line in lines)
    assert any(line.startswith("fraud pipeline over 51 transactions") for line in lines)
    assert any("-> positive" in line and "-> negative" in line for line in lines)
