"""What `serve --workers 2` buys and costs on this machine: throughput at concurrency 8 and
32 over HTTP and gRPC, sequential p50 at concurrency 1, and memory per worker.

    python benchmarks/workers.py [--rounds 3] [--seconds 5]
    python benchmarks/workers.py --quick      # one short round, to check the script; writes nothing

The example fraud_mlp (a microsecond model: the server's own per-request cost is what is
measured) served by 1 worker and by 2, the two servers side by side and measured
alternately, round by round, by Triton's perf_analyzer (C++, the lightest client we have).
The client shares the 2 vCPUs with the server: every figure is server and client together.
Workers share the ports per connection, so a client reaches several workers only over
several connections: perf_analyzer runs up to 8 threads, and over gRPC each thread gets its
own channel (``TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1``; Triton's clients otherwise
share one channel, one TCP connection, among up to 6 of them).
Memory is each process's PSS (proportional set size: shared pages split between the
processes that map them) from /proc/PID/smaps_rollup, after the load.

Writes the "workers" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_vs_perf_analyzer import pa_level, perf_analyzer, rounds_args
from report_sections import write_section
from server_overhead import cpu_description

from milliserve.examples.fraud_mlp import build_fraud_mlp
from milliserve.testing import ServerProcess, wait_until

LEVELS = (("http", 1), ("http", 8), ("http", 32), ("grpc", 1), ("grpc", 8), ("grpc", 32))


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def processes(srv: ServerProcess) -> list[int]:
    assert srv.proc is not None
    pid = srv.proc.pid
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(int(k) for k in kids)]


def measure(
    pa: str, env: dict[str, str], srv: ServerProcess, proto: str, conc: int, ms: int, out: Path
) -> tuple[float, float]:
    url = srv.http_url if proto == "http" else srv.grpc_url
    if proto == "grpc":  # a channel per client thread, not one shared by up to 6
        env = dict(env, TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT="1")
    thr, p50, _ = pa_level(pa, env, url, "fraud_mlp", conc, ms, out, "-i", proto, "--max-threads", "8")
    return thr, p50


def main() -> None:
    args = rounds_args()
    pa, env = perf_analyzer()
    work = Path(tempfile.mkdtemp(prefix="ms-workers-"))
    repo = work / "repo"
    build_fraud_mlp(repo)
    results: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    memory: dict[int, list[float]] = {}
    with ServerProcess(repo) as one, ServerProcess(repo, "--workers", "2") as two:
        wait_until(lambda: two.logs().count(": serving") >= 2, 60, "both workers serving")
        servers = {1: one, 2: two}
        for rnd in range(args.rounds):
            for proto, conc in LEVELS:
                order = (1, 2) if rnd % 2 == 0 else (2, 1)
                for n in order:
                    out = work / f"{n}-{proto}-{conc}-{rnd}.csv"
                    thr, p50 = measure(pa, env, servers[n], proto, conc, int(args.seconds * 1000), out)
                    results.setdefault((n, proto, conc), []).append((thr, p50))
                    print(f"round {rnd} workers={n} {proto} c{conc}: {thr:.0f} infer/s, p50 {p50:.3f} ms")
        for n, srv in servers.items():
            memory[n] = [pss_mib(p) for p in processes(srv)]
    for n, m in memory.items():
        print(f"workers={n}: PSS MiB per process {[round(x, 1) for x in m]}")
    if args.quick:
        print("quick run: no report written")
        return
    write_section("workers", report(args, results, memory))
    print("wrote the workers section of docs/benchmarks.md")


def report(
    args: argparse.Namespace,
    results: dict[tuple[int, str, int], list[tuple[float, float]]],
    memory: dict[int, list[float]],
) -> str:
    def med(n: int, proto: str, conc: int, i: int) -> float:
        return statistics.median(r[i] for r in results[(n, proto, conc)])

    lines = [
        "## Worker processes: `serve --workers 2` against one process",
        "",
        f"`python benchmarks/workers.py --rounds {args.rounds} --seconds {args.seconds:g}`: "
        f"{cpu_description()}; perf_analyzer on the same vCPUs as the server. The example "
        f"fraud_mlp (microseconds of compute), one server with 1 worker and one with 2, measured "
        f"alternately, {args.seconds:g} s per level, {args.rounds} rounds, medians.",
        "",
        "| protocol | concurrency | 1 worker infer/s | 2 workers infer/s | gain "
        "| 1 worker p50 ms | 2 workers p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for proto, conc in LEVELS:
        a, b = med(1, proto, conc, 0), med(2, proto, conc, 0)
        lines.append(
            f"| {proto} | {conc} | {a:,.0f} | {b:,.0f} | {b / a:.2f}× | "
            f"{med(1, proto, conc, 1):.3f} | {med(2, proto, conc, 1):.3f} |"
        )
    one, two = memory[1], memory[2]
    lines += [
        "",
        f"Memory (PSS, MiB): 1 worker {one[0]:.0f}; 2 workers: parent {two[0]:.0f}, "
        f"workers {', '.join(f'{x:.0f}' for x in two[1:])} (total {sum(two):.0f}).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
