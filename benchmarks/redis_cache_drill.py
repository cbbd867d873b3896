"""Redis response cache drill (issue 10): hit ratio with a healthy and with a busy Redis,
then Redis killed and restarted on the same port under load.

    python benchmarks/redis_cache_drill.py [--requests 3000] [--down-s 2]
    ../shared/tools/under-load python benchmarks/redis_cache_drill.py   # two CPU burners

One server (``add_sub`` with ``response_cache { enable: true backend: "redis" }``, the
default Redis settings: 50 ms per call, 5 failures within 1 s open the breaker for 1 s)
and one redis-server, both on loopback; 4 client threads send 50 distinct inputs
round-robin over HTTP/JSON the whole time. Phases:

1. healthy: the hit ratio over ``--requests`` requests (server statistics);
2. busy: the same while another client holds Redis for ``--stall-ms`` every
   ``--stall-every-ms`` (DEBUG SLEEP), as a neighbour's slow command would;
3. outage: Redis stopped for ``--down-s``, then restarted on the same port (empty): the
   requests that failed from the kill until hits came back, and the seconds from the
   restart to the first hit (target: 2 s).

Prints the figures; writes nothing. This is the scenario of
tests/e2e/test_redis_breaker.py, measured instead of asserted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from milliserve.drills.cache_drill import Load, Stalls, cache_counts, write_add_sub
from milliserve.percentiles import percentiles
from milliserve.testing import RedisServer, ServerProcess


def measure(load: Load, http_url: str, requests: int, label: str) -> float:
    """Run ``requests`` more requests; print and return the hit ratio over them."""
    h0, m0 = cache_counts(http_url)
    n0, lat0, t0 = load.sent, len(load.latencies), time.perf_counter()
    load.wait_sent(n0 + requests)
    h1, m1 = cache_counts(http_url)
    elapsed = time.perf_counter() - t0
    ratio = (h1 - h0) / max(1, (h1 - h0) + (m1 - m0))
    p50, p99 = percentiles(load.latencies[lat0:], [50, 99])
    print(
        f"{label:8s} hit ratio {ratio:.3f} ({h1 - h0} hits, {m1 - m0} misses); "
        f"{(load.sent - n0) / elapsed:.0f} req/s, p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
    )
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000, help="per hit-ratio phase")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--inputs", type=int, default=50)
    ap.add_argument("--stall-ms", type=float, default=10.0)
    ap.add_argument("--stall-every-ms", type=float, default=100.0)
    ap.add_argument("--down-s", type=float, default=2.0)
    ap.add_argument("--resume-timeout-s", type=float, default=30.0)
    args = ap.parse_args()
    print(f"{os.cpu_count()} vCPU, load average {os.getloadavg()[0]:.2f} at start")
    repo = Path(tempfile.mkdtemp(prefix="ms-redis-drill-"))
    write_add_sub(repo)
    redis_server = RedisServer()
    redis_server.start()
    try:
        with (
            ServerProcess(repo, "--redis-url", redis_server.url) as server,
            Load(server.http_url, args.threads, args.inputs) as load,
        ):
            load.wait_sent(args.inputs)  # each input about once: warm
            measure(load, server.http_url, args.requests, "healthy")
            with Stalls(redis_server.url, args.stall_ms / 1000, args.stall_every_ms / 1000):
                measure(load, server.http_url, args.requests, "busy")
            failed0, sent0 = load.failed, load.sent
            redis_server.stop()
            time.sleep(args.down_s)  # a real outage lasts: requests keep coming meanwhile
            redis_server = RedisServer(port=redis_server.port)
            redis_server.start()
            restarted = time.monotonic()
            hits = cache_counts(server.http_url)[0]
            resumed_s: float | None = None
            while time.monotonic() - restarted < args.resume_timeout_s:
                if cache_counts(server.http_url)[0] > hits:
                    resumed_s = time.monotonic() - restarted
                    break
                time.sleep(0.01)
            down_failed, down_sent = load.failed - failed0, load.sent - sent0
            measure(load, server.http_url, args.requests, "after")
        print(
            f"outage   Redis down {args.down_s:g} s: {down_failed} of {down_sent} requests failed "
            f"from the kill until hits resumed; {load.failed} failed, {load.wrong} wrong in all"
        )
        print(
            "resume   "
            + (f"{resumed_s:.2f} s" if resumed_s is not None else f"none within {args.resume_timeout_s:g} s")
            + " from the restart to the first hit (target 2 s)"
        )
        for e in load.errors:
            print("  error:", e)
        for line in server.logs().splitlines():
            if "redis" in line:
                print("  log:", line)
    finally:
        redis_server.stop()


if __name__ == "__main__":
    main()
