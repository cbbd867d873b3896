"""How close to the truth does `milliserve bench` measure? The load generator against the
fake OIP server (milliserve.bench.fake_server), whose latency is known, and the cold start
of the example fraud_mlp: the performance claims that tests/unit/bench/test_bench_truth.py
and tests/e2e/test_bench_cli.py used to hold. The tests keep what holds on any machine
(floors, ceilings a sleep sets, modes told apart); these bounds hold on an idle machine
and are checked here, one scenario at a time, with nothing else running.

    python benchmarks/bench_truth.py            # prints each claim, exits 1 if one fails
    python benchmarks/bench_truth.py --json out.json

Claims (idle 2-vCPU VM):
- 1 ms answers with a 50 ms one every 50th: p50 <= 2.5 ms, p99 <= 70 ms (idle ~1.2/51 ms);
- one request in flight against the 1 ms server: >= 300 requests/s (idle ~850/s);
- 3 ms against 1 ms compared: p50 ratio 1.8-4.5 (idle ~2.8), throughput ratio <= 0.6;
- the tool's own overhead (calibration against a null server): p50 < 5 ms;
- `milliserve bench --cold-start` on fraud_mlp: loaded in < 30 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milliserve.bench.fake_server import fake_server_process
from milliserve.bench.runner import BenchConfig, run_bench
from milliserve.examples.fraud_mlp import build_fraud_mlp
from milliserve.testing import ServerProcess


@dataclass(frozen=True)
class Claim:
    what: str
    value: float
    low: float
    high: float

    @property
    def holds(self) -> bool:
        return self.low <= self.value <= self.high


def _level(url: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("calibrate", False)
    report = run_bench(BenchConfig(url=url, model="fake", workers=1, **kw))
    return report.levels[0].as_dict()


def known_distribution() -> list[Claim]:
    with fake_server_process("--latency-ms", "1", "--slow-every", "50", "--slow-ms", "50") as url:
        r = _level(url, concurrency=[1], duration_s=4, warmup_s=0.5)
    lat = r["latency_us"]
    return [
        Claim("1 ms server, 50 ms every 50th: p50 µs", lat["p50"], 1000, 2500),
        Claim("1 ms server, 50 ms every 50th: p99 µs", lat["p99"], 45_000, 70_000),
    ]


def one_in_flight() -> list[Claim]:
    with fake_server_process("--latency-ms", "1") as url:
        r = _level(url, concurrency=[1], stability_pct=50.0, window_s=0.5, warmup_s=0.2)
    return [Claim("1 ms server, one in flight: requests/s", r["throughput"], 300, 1000)]


def compared() -> list[Claim]:
    with (
        fake_server_process("--latency-ms", "1") as fast,
        fake_server_process("--latency-ms", "3") as slow,
    ):
        cfg = BenchConfig(
            url=fast,
            model="fake",
            workers=1,
            concurrency=[1],
            duration_s=1.0,
            warmup_s=0.2,
            compare_url=slow,
            rounds=2,
            calibrate=False,
        )
        (row,) = run_bench(cfg).compare
    ratios = row["b_over_a"]
    return [
        Claim("3 ms over 1 ms: p50 ratio", ratios["p50"], 1.8, 4.5),
        Claim("3 ms over 1 ms: throughput ratio", ratios["throughput"], 0.0, 0.6),
    ]


def overhead() -> list[Claim]:
    with fake_server_process("--latency-ms", "1") as url:
        report = run_bench(
            BenchConfig(
                url=url, model="fake", workers=1, concurrency=[1], duration_s=1, warmup_s=0.2, calibrate=True
            )
        )
    calibration = report.as_dict()["calibration"] or {}
    return [Claim("the tool's own overhead: null server p50 µs", calibration["null_server_p50_us"], 0, 5000)]


def cold_start() -> list[Claim]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        build_fraud_mlp(repo)
        out = Path(tmp) / "cold.json"
        args = ["--model-control-mode", "explicit", "--load-model", "fraud_mlp"]
        with ServerProcess(repo, *args) as srv:
            cmd = [sys.executable, "-m", "milliserve", "bench", f"http://{srv.http_url}", "-m", "fraud_mlp"]
            cmd += ["--cold-start", "--no-calibrate", "--duration", "0.5", "--warmup", "0.2"]
            subprocess.run([*cmd, "--json", str(out)], check=True, capture_output=True, timeout=300)
        cold = json.loads(out.read_text())["cold_start"]
    return [Claim("fraud_mlp cold start: load s", cold["load_s"], 0, 30)]


SCENARIOS = (known_distribution, one_in_flight, compared, overhead, cold_start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None, help="write the claims and figures as JSON")
    args = ap.parse_args()
    claims = [c for scenario in SCENARIOS for c in scenario()]
    for c in claims:
        print(f"{'ok  ' if c.holds else 'FAIL'} {c.what}: {c.value:,.3f} (claim {c.low:g}-{c.high:g})")
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ | {"holds": c.holds} for c in claims], indent=2))
    return 0 if all(c.holds for c in claims) else 1


if __name__ == "__main__":
    sys.exit(main())
