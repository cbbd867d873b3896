"""Calibrate the load generator against a null server (the fake OIP server with zero
latency, in its own process on loopback): what the tool, the loopback and a
minimal server add to every measurement. Reported with every run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from typing import Any

from milliserve.bench.loadgen import WorkerPool
from milliserve.bench.results import summarize
from milliserve.bench.workload import build_workload, parse_target

__all__ = ["calibrate"]


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def calibrate(workers: int, seconds: float = 1.0) -> dict[str, Any]:
    """p50/p99 and throughput of one request in flight against the null server."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "milliserve.bench.fake_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the calibration server did not start") from None
                time.sleep(0.05)
        workload = build_workload(parse_target(f"http://127.0.0.1:{port}"), "fake")
        pool = WorkerPool(workload, workers)
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
    finally:
        proc.terminate()
        proc.wait(10)
    return {
        "null_server_p50_us": lv.latency_us.get("p50"),
        "null_server_p99_us": lv.latency_us.get("p99"),
        "null_server_throughput": round(lv.throughput, 1),
        "note": "HTTP, one request in flight, against a zero-latency server on loopback",
    }
