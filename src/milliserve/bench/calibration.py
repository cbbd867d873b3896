"""Calibrate the load generator against a null server (the fake OIP server with zero
latency, in its own process on loopback): what the tool, the loopback and a
minimal server add to every measurement. Reported with every run."""

from __future__ import annotations

import os
import time
from typing import Any

from milliserve.bench.fake_openai import fake_openai_process
from milliserve.bench.fake_server import fake_server_process
from milliserve.bench.llm_loadgen import LlmRecords, run_llm_job
from milliserve.bench.llm_prompts import BUILTIN_SETS
from milliserve.bench.llm_results import Slo, summarize_llm
from milliserve.bench.llm_workload import build_llm_workload, parse_llm_target
from milliserve.bench.loadgen import ProcessPool, WorkerPool
from milliserve.bench.results import summarize
from milliserve.bench.workload import build_workload, parse_target

__all__ = ["calibrate", "calibrate_llm"]


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


def calibrate_llm(workers: int, seconds: float = 1.0) -> dict[str, Any]:
    """TTFT, ITL and end-to-end p50/p99 against a streaming server with no delays
    (16 one-token chunks written back to back), one request in flight."""
    with fake_openai_process("--tokens", "16") as url:
        w = build_llm_workload(parse_llm_target(url), "fake-llm", BUILTIN_SETS["chat"][:1], max_tokens=16)
        pool = ProcessPool(w, workers, run_llm_job, LlmRecords.merge)
        try:
            t0 = time.monotonic()
            rec = pool.run_job("closed", 1, seconds, warmup_s=0.3)
            lv = summarize_llm("closed", 1, rec, os.cpu_count() or 1, time.monotonic() - t0, Slo())
        finally:
            pool.close()
    return {
        "null_server_ttft_p50_ms": lv.ttft_ms.get("p50"),
        "null_server_ttft_p99_ms": lv.ttft_ms.get("p99"),
        "null_server_itl_p50_ms": lv.itl_ms.get("p50"),
        "null_server_e2e_p50_ms": lv.e2e_ms.get("p50"),
        "note": "HTTP streaming, one request in flight, 16 chunks from a zero-latency server on loopback",
    }
