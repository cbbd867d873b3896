"""Budget-driven batching against fixed queue delays, on the example MiniLM model.

    python benchmarks/adaptive_batching.py [--loads 0.3,0.6,0.8,0.95] [--rates R,...] [--seconds 8]

Three copies of MiniLM in one server: `dynamic_batching { target_p99_ms: 20 }` (adaptive),
a small fixed `max_queue_delay` (100 µs) and a large one (20 ms). The machine's capacity
is measured first (closed loop, 16 connections, on the small-delay copy), and the rates
are fractions of it (``--loads``; or give ``--rates``), so that every point is a load
this machine can carry: rates over capacity only measure how fast queues grow.
`milliserve bench` drives each copy with open-loop Poisson arrivals (latency from the
scheduled send, so coordinated omission is corrected), interleaved per rate
(A B C for each rate, ``--rounds`` times), and the table gives each point's median over the
rounds with its range. Writes the "adaptive-batching" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from minilm_copies import SEQ, bench, build_copies
from report_sections import write_section

from milliserve.testing import ServerProcess

VARIANTS = {
    "adaptive (target p99 20 ms)": ("minilm_adaptive", "  target_p99_ms: 20"),
    "fixed delay 100 µs": ("minilm_small_delay", "  max_queue_delay_microseconds: 100"),
    "fixed delay 20 ms": ("minilm_large_delay", "  max_queue_delay_microseconds: 20000"),
}


def bench_rate(url: str, model: str, rate: float, seconds: float, out: Path) -> dict[str, float]:
    lv = bench(url, model, out, "--rate", str(rate), seconds=seconds)
    return {
        "rate": rate,
        "throughput": lv["throughput"],
        "p50": lv["latency_us"]["p50"] / 1e3,
        "p99": lv["latency_us"]["p99"] / 1e3,
        "errors": sum(lv["errors"].values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", default="0.3,0.6,0.8,0.95", help="fractions of the measured capacity")
    ap.add_argument("--rates", default=None, help="req/s instead of --loads")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ms-adaptive-"))
    build_copies(work / "repo", {model: (batching, "") for model, batching in VARIANTS.values()})
    runs: dict[tuple[str, float], list[dict[str, float]]] = {}
    with ServerProcess(work / "repo") as server:
        small = VARIANTS["fixed delay 100 µs"][0]
        capacity = bench(server.http_url, small, work / "capacity.json", "--concurrency", "16", seconds=6)[
            "throughput"
        ]
        if args.rates:
            rates = [float(r) for r in args.rates.split(",")]
        else:
            rates = [round(capacity * float(f)) for f in args.loads.split(",")]
        for rate in rates:
            for _ in range(args.rounds):
                for label, (model, _) in VARIANTS.items():  # interleaved per rate: A B C A B C ...
                    out = work / f"{model}-{rate}.json"
                    runs.setdefault((label, rate), []).append(
                        bench_rate(server.http_url, model, rate, args.seconds, out)
                    )
    lines = [
        "## Budget-driven batching against fixed queue delays (MiniLM)",
        "",
        f"`python benchmarks/adaptive_batching.py`: MiniLM-L6, {SEQ} tokens, max batch 32, 2 ORT threads, "
        "one server; open-loop Poisson arrivals from `milliserve bench` (latency from the scheduled send), "
        f"{args.seconds:g} s per point after 2 s of warm-up, the three configs interleaved at each rate, "
        f"{args.rounds} rounds; medians over the rounds, the p99's range in brackets. Capacity measured "
        f"first (closed loop, 16 connections, small fixed delay): {capacity:.0f} req/s; the rates are "
        + (f"{args.loads} of it. " if not args.rates else "given. ")
        + "Target: p99 under 20 ms; and the adaptive config at least as good as the better fixed one "
        "at every rate (issue 10).",
        "",
        "| config | offered req/s | served req/s | p50 ms | p99 ms (range) | errors | p99 ≤ 20 ms |",
        "|---|---|---|---|---|---|---|",
    ]

    def med(label: str, rate: float, key: str) -> float:
        return statistics.median(r[key] for r in runs[(label, rate)])

    for label in VARIANTS:
        for rate in rates:
            p99s = [r["p99"] for r in runs[(label, rate)]]
            p99, served, p50 = (med(label, rate, k) for k in ("p99", "throughput", "p50"))
            errors = sum(r["errors"] for r in runs[(label, rate)])
            lines.append(
                f"| {label} | {rate:.0f} | {served:.0f} | {p50:.2f} | {p99:.2f} ({min(p99s):.1f}-"
                f"{max(p99s):.1f}) | {errors:.0f} | {'yes' if p99 <= 20 else '**no**'} |"
            )
    adaptive, fixed = next(iter(VARIANTS)), list(VARIANTS)[1:]
    lines += [
        "",
        "| offered req/s | adaptive p99 ms | better fixed p99 ms | adaptive ≤ better fixed |",
        "|---|---|---|---|",
    ]
    for rate in rates:
        best = min(med(label, rate, "p99") for label in fixed)
        mine = med(adaptive, rate, "p99")
        lines.append(f"| {rate:.0f} | {mine:.2f} | {best:.2f} | {'yes' if mine <= best else '**no**'} |")
    write_section(
        "adaptive-batching",
        "\n".join(lines),
        results={
            "settings": {"run": vars(args), "variants": VARIANTS, "seq": SEQ},
            "rounds": args.rounds,
            "values": runs,  # (config, rate) -> each round's throughput, p50/p99 ms, errors
            "summary": {"capacity_req_s": capacity, "rates": rates},
        },
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
