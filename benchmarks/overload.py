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
import tempfile
from pathlib import Path

from minilm_copies import SEQ, bench, build_copies
from report_sections import write_section

from milliserve.testing import ServerProcess

MODELS = {"budget p99 50 ms": ("minilm_budget", "budget: {p99_ms: 50}\n"), "no budget": ("minilm_plain", "")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ms-overload-"))
    repo = work / "repo"
    delay = "  max_queue_delay_microseconds: 1000"
    build_copies(repo, {name: (delay, extra) for name, extra in MODELS.values()})
    with ServerProcess(repo) as server:
        capacity = bench(
            server.http_url, "minilm_plain", work / "cap.json", "--concurrency", "8", seconds=args.seconds
        )["throughput"]
        rate = 2 * capacity
        rows = []
        for rnd in range(2):  # A B A B
            for label, (model, _) in MODELS.items():
                lv = bench(
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
    write_section(
        "overload",
        "\n".join(lines),
        results={
            "settings": {"run": vars(args), "models": MODELS, "seq": SEQ},
            "rounds": 2,
            "values": rows,  # (config, its `milliserve bench` level) per run, A B A B
            "summary": {"capacity_req_s": capacity, "offered_req_s": rate},
        },
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
