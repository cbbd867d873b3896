"""Calibrate the load generator against a null server (the fake OIP server with zero
latency, in its own process on loopback): what the tool, the loopback and a
minimal server add to every measurement. Reported with every run."""

from __future__ import annotations

import os
import time
from typing import Any

from milliserve.bench.fake_server import fake_server_process
from milliserve.bench.loadgen import WorkerPool
from milliserve.bench.results import summarize
from milliserve.bench.workload import build_workload, parse_target

__all__ = ["calibrate"]


def calibrate(workers: int, seconds: float = 1.0) -> dict[str, Any]:
    """p50/p99 and throughput of one request in flight against the null server."""
    with fake_server_process() as url:
        pool = WorkerPool(build_workload(parse_target(url), "fake"), workers)
        try:
            t0 = time.monotonic()
            rec = pool.run("closed", 1, 0.3 + seconds)
            start = float(rec.intended.min())
            lv = summarize(
                "closed",
                1,
                rec,
                start + 0.3,
                start + 0.3 + seconds,
                os.cpu_count() or 1,
                time.monotonic() - t0,
            )
        finally:
            pool.close()
    return {
        "null_server_p50_us": lv.latency_us.get("p50"),
        "null_server_p99_us": lv.latency_us.get("p99"),
        "null_server_throughput": round(lv.throughput, 1),
        "note": "HTTP, one request in flight, against a zero-latency server on loopback",
    }
