"""Budget-driven batching against fixed queue delays, on the example MiniLM model.

    python benchmarks/adaptive_batching.py [--rates 50,150,250,350] [--seconds 6]

Three copies of MiniLM in one server: `dynamic_batching { target_p99_ms: 20 }` (adaptive),
a small fixed `max_queue_delay` (100 µs) and a large one (20 ms). `milliserve bench`
drives each with open-loop Poisson arrivals at low, medium and high rates (latency from
the scheduled send, so coordinated omission is corrected), interleaved per rate
(A B C for each rate). Writes the "adaptive-batching" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--rates", default="50,150,250,350")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ms-adaptive-"))
    build_copies(work / "repo", {model: (batching, "") for model, batching in VARIANTS.values()})
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
    with ServerProcess(work / "repo") as server:
        for rate in rates:
            for label, (model, _) in VARIANTS.items():  # interleaved per rate
                rows[label].append(
                    bench_rate(server.http_url, model, rate, args.seconds, work / f"{model}-{rate}.json")
                )
    lines = [
        "## Budget-driven batching against fixed queue delays (MiniLM)",
        "",
        f"`python benchmarks/adaptive_batching.py`: MiniLM-L6, {SEQ} tokens, max batch 32, 2 ORT threads, "
        "one server; open-loop Poisson arrivals from `milliserve bench` (latency from the scheduled send), "
        f"{args.seconds:g} s per point after 2 s of warm-up, the three configs interleaved at each rate. "
        "Target: p99 under 20 ms.",
        "",
        "| config | offered req/s | served req/s | p50 ms | p99 ms | errors | p99 ≤ 20 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, results in rows.items():
        for r in results:
            ok = "yes" if r["p99"] <= 20 else "**no**"
            lines.append(
                f"| {label} | {r['rate']:.0f} | {r['throughput']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
                f"{r['errors']:.0f} | {ok} |"
            )
    write_section("adaptive-batching", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
