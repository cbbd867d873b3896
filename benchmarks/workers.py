"""What `serve --workers 2` buys and costs on this machine: throughput at concurrency 8 and
32 over HTTP and gRPC, sequential p50 at concurrency 1, the server's CPU per request, how
the kernel shared the calls between the two workers, and memory per worker.

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
processes that map them) from /proc/PID/smaps_rollup, after the load. CPU per request is
the server's processes' user + system time (/proc/PID/stat) over a level divided by the
requests it served (milliserve_inference_request_success_total, per worker, from /metrics);
the busier worker's share is its part of those requests.

Writes the "workers" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import urllib.request
from pathlib import Path

from bench_vs_perf_analyzer import pa_level, perf_analyzer, rounds_args
from prometheus_client.parser import text_string_to_metric_families
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


def cpu_s(srv: ServerProcess) -> float:
    """User + system CPU seconds of the server's processes so far."""
    total = 0
    for pid in processes(srv):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def served(srv: ServerProcess) -> dict[str, float]:
    """fraud_mlp's successful requests so far, per worker ("" for a lone server)."""
    with urllib.request.urlopen(srv.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (
                s.name == "milliserve_inference_request_success_total"
                and s.labels.get("model") == "fraud_mlp"
            ):
                w = s.labels.get("worker", "")
                out[w] = out.get(w, 0.0) + s.value
    return out


def measure(
    pa: str, env: dict[str, str], srv: ServerProcess, proto: str, conc: int, ms: int, out: Path
) -> tuple[float, float, float, float]:
    """(infer/s, p50 ms, server CPU µs per request, the busier worker's share of requests)."""
    url = srv.http_url if proto == "http" else srv.grpc_url
    if proto == "grpc":  # a channel per client thread, not one shared by up to 6
        env = dict(env, TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT="1")
    before, cpu0 = served(srv), cpu_s(srv)
    thr, p50, _ = pa_level(pa, env, url, "fraud_mlp", conc, ms, out, "-i", proto, "--max-threads", "8")
    cpu1, after = cpu_s(srv), served(srv)
    per_worker = [after[w] - before.get(w, 0.0) for w in after]
    n = sum(per_worker)
    return (
        thr,
        p50,
        (cpu1 - cpu0) / n * 1e6 if n else float("nan"),
        max(per_worker) / n if n else float("nan"),
    )


def main() -> None:
    args = rounds_args()
    pa, env = perf_analyzer()
    work = Path(tempfile.mkdtemp(prefix="ms-workers-"))
    repo = work / "repo"
    build_fraud_mlp(repo)
    results: dict[tuple[int, str, int], list[tuple[float, float, float, float]]] = {}
    memory: dict[int, list[float]] = {}
    with ServerProcess(repo) as one, ServerProcess(repo, "--workers", "2") as two:
        wait_until(lambda: two.logs().count(": serving") >= 2, 60, "both workers serving")
        servers = {1: one, 2: two}
        for rnd in range(args.rounds):
            for proto, conc in LEVELS:
                order = (1, 2) if rnd % 2 == 0 else (2, 1)
                for n in order:
                    out = work / f"{n}-{proto}-{conc}-{rnd}.csv"
                    x = measure(pa, env, servers[n], proto, conc, int(args.seconds * 1000), out)
                    results.setdefault((n, proto, conc), []).append(x)
                    print(
                        f"round {rnd} workers={n} {proto} c{conc}: {x[0]:.0f} infer/s, p50 {x[1]:.3f} ms, "
                        f"server CPU {x[2]:.0f} µs/request, busier worker {x[3]:.0%}"
                    )
        for n, srv in servers.items():
            memory[n] = [pss_mib(p) for p in processes(srv)]
    for n, m in memory.items():
        print(f"workers={n}: PSS MiB per process {[round(x, 1) for x in m]}")
    if args.quick:
        print("quick run: no report written")
        return
    write_section(
        "workers",
        report(args, results, memory),
        results={
            "settings": {"run": vars(args)},
            "rounds": args.rounds,
            # (workers, protocol, concurrency) -> each round's (infer/s, p50 ms, server CPU µs
            # per request, the busier worker's share)
            "values": results,
            "summary": {"pss_mib_per_process": memory},
            "peers": {"tritonclient": None},  # perf_analyzer's wheel
        },
    )
    print("wrote the workers section of docs/benchmarks.md")


def report(
    args: argparse.Namespace,
    results: dict[tuple[int, str, int], list[tuple[float, float, float, float]]],
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
        "| 1 worker p50 ms | 2 workers p50 ms | server CPU µs/request, 1 worker / 2 "
        "| busier worker's share of requests |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for proto, conc in LEVELS:
        a, b = med(1, proto, conc, 0), med(2, proto, conc, 0)
        share = [r[3] for r in results[(2, proto, conc)]]
        lines.append(
            f"| {proto} | {conc} | {a:,.0f} | {b:,.0f} | {b / a:.2f}× | "
            f"{med(1, proto, conc, 1):.3f} | {med(2, proto, conc, 1):.3f} "
            f"| {med(1, proto, conc, 2):.0f} / {med(2, proto, conc, 2):.0f} "
            f"| {statistics.median(share):.0%} ({min(share):.0%}–{max(share):.0%}) |"
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
