"""Overload: MiniLM offered twice what it can sustain, with and without a latency budget.

    python benchmarks/overload.py [--seconds 8]

Two copies of MiniLM in one server, one with `budget { p99_ms: 50 }` (requests without
a deadline of their own get 50 ms, and deadline admission refuses what cannot make it)
and one without. `milliserve bench` first finds the sustainable rate (closed loop,
concurrency 8), then offers 2x that rate open-loop (Poisson), interleaving the two
models. Writes the "overload" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from report_sections import write_section

from milliserve.examples.minilm import build_minilm
from milliserve.testing import ServerProcess

SEQ = 32
CONFIG = """\
name: {name}
backend: onnxruntime
max_batch_size: 32
input:
  - {{name: input_ids, data_type: TYPE_INT64, dims: [-1]}}
  - {{name: attention_mask, data_type: TYPE_INT64, dims: [-1]}}
output:
  - {{name: embedding, data_type: TYPE_FP32, dims: [384]}}
dynamic_batching:
  preferred_batch_size: [8, 16, 32]
  max_queue_delay_microseconds: 1000
  default_queue_policy: {{max_queue_size: 1024}}
parameters: {{intra_op_thread_count: "2"}}
{extra}"""
MODELS = {"budget p99 50 ms": ("minilm_budget", "budget: {p99_ms: 50}\n"), "no budget": ("minilm_plain", "")}


def _bench(url: str, model: str, out: Path, *load: str, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "milliserve", "bench", f"http://{url}", "-m", model, *load]
    cmd += ["--duration", str(seconds), "--warmup", "2", "--no-calibrate", "--json", str(out)]
    cmd += ["--shape", f"input_ids:{SEQ}", "--shape", f"attention_mask:{SEQ}", "--data", "zero"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lv: dict[str, Any] = json.loads(out.read_text())["levels"][0]
    return lv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ms-overload-"))
    repo = work / "repo"
    build_minilm(repo)
    for name, extra in MODELS.values():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(repo / "minilm" / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        (repo / name / "config.yaml").write_text(CONFIG.format(name=name, extra=extra))
    shutil.rmtree(repo / "minilm")
    with ServerProcess(repo) as server:
        capacity = _bench(
            server.http_url, "minilm_plain", work / "cap.json", "--concurrency", "8", seconds=args.seconds
        )["throughput"]
        rate = 2 * capacity
        rows = []
        for rnd in range(2):  # A B A B
            for label, (model, _) in MODELS.items():
                lv = _bench(
                    server.http_url,
                    model,
                    work / f"{model}-{rnd}.json",
                    "--rate",
                    f"{rate:.0f}",
                    seconds=args.seconds,
                )
                rows.append((label, lv))
    lines = [
        "## Overload: twice the sustainable rate, with and without a budget (MiniLM)",
        "",
        f"`python benchmarks/overload.py`: MiniLM-L6, {SEQ} tokens, max batch 32, 1 ms max queue delay, "
        f"queue bound 1024, 2 ORT threads. Sustainable rate measured first (closed loop, concurrency 8): "
        f"**{capacity:.0f} req/s**; then {rate:.0f} req/s offered open-loop (Poisson, latency from the "
        f"scheduled send) for {args.seconds:g} s per run, the two models interleaved twice. Latencies are of "
        "the requests served; refused ones are counted by status.",
        "",
        "| config | run | offered req/s | served req/s | p50 ms | p99 ms | refused (status: count) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (label, lv) in enumerate(rows):
        by_status: dict[str, int] = {}
        for key, n in lv["errors"].items():  # "http 429: {message}" -> "http 429"
            status = key.split(":", 1)[0]
            by_status[status] = by_status.get(status, 0) + n
        refused = ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items())) or "none"
        lat = lv["latency_us"]
        lines.append(
            f"| {label} | {i // 2 + 1} | {rate:.0f} | {lv['throughput']:.0f} "
            f"| {lat.get('p50', 0) / 1e3:.1f} | {lat.get('p99', 0) / 1e3:.1f} | {refused} |"
        )
    example = next((k for _, lv in rows for k in lv["errors"] if k.startswith("http 429")), None)
    if example:
        lines += ["", f"A refusal reads: `{example.split(': ', 1)[1]}`"]
    write_section("overload", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
