"""docs/tutorial-sentiment.md, run as a reader would: every command of its bash blocks, in
order, on 100 tweets with one-second load runs and free ports (the install lines are the
suite's own install, so they are left out)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from milliserve.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial-sentiment.md"


def _script(workdir: Path) -> str:
    blocks = re.findall(r"```bash\n(.*?)\n```", TUTORIAL.read_text(), re.S)
    lines = [line for b in blocks for line in b.splitlines() if not line.startswith("pip install")]
    # whatever fails, the servers the tutorial started are stopped (by PID)
    cleanup = (
        'trap \'for f in "$T"/*.pid; do kill $(cat "$f") 2>/dev/null || true; done; '
        "redis-cli -p $REDIS shutdown nosave >/dev/null 2>&1 || true' EXIT"
    )
    return "\n".join(["set -euo pipefail", f"cd {ROOT}", *lines[:3], cleanup, *lines[3:]]) + "\n"


@pytest.mark.timeout(1800)  # the tutorial's own script may take 1500 s (below)
def test_tutorial_commands_run_and_measure(tmp_path: Path) -> None:
    t = tmp_path / "t"
    env = {
        **os.environ,
        "T": str(t),
        "NAIVE": str(free_port()),
        "HTTP": str(free_port()),
        "GRPC": str(free_port()),
        "METRICS": str(free_port()),
        "REDIS": str(free_port()),
        "SECONDS_PER_RUN": "1",
        "EVAL": "100",
        "HF_HUB_OFFLINE": "1",
        # the tutorial's `python` and `milliserve` are this environment's
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    script = tmp_path / "tutorial.sh"
    script.write_text(_script(tmp_path))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # what the steps left behind: the data, the naive capacity, optimize's choice and report
    assert len((t / "data" / "eval.txt").read_text().splitlines()) == 100
    capacity = json.loads((t / "naive-capacity.json").read_text())["levels"][0]
    assert capacity["ok"] > 0
    report = json.loads((t / "optimized" / "sentiment_model" / "report.json").read_text())
    assert {r["name"] for r in report["rows"]} >= {"fp32", "int8_dynamic"}
    assert (t / "optimized" / "sentiment_model" / "1" / "model.onnx").is_file()
    assert "sentiment_cached" in (t / "repo" / "sentiment_cached" / "config.yaml").read_text()
    # every bench run printed its table, and the budget report its stages
    assert done.stdout.count("p99") >= 8, done.stdout[-4000:]
    assert "serialize" in done.stdout
