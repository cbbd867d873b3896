"""The server's own clock on each request (MILLISERVE_HTTP__WIRE_TIMING_FILE), the third
witness when two load generators disagree (docs/bench.md): every request is timed once, on
the clock the clients read, between the client's send and the answer's arrival."""

from __future__ import annotations

import http.client
import os
import time
from pathlib import Path

import numpy as np
import pytest

from milliserve.bench.loadgen import WorkerPool
from milliserve.bench.workload import build_workload, parse_target
from milliserve.server.wire_timing import read_wire_log
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

BODY = (
    b'{"inputs":[{"name":"features","shape":[1,64],"datatype":"FP32","data":['
    + b",".join([b"0.1"] * 64)
    + b"]}]}"
)


def test_each_request_is_timed_inside_its_round_trip(example_repo: Path, tmp_path: Path) -> None:
    log = tmp_path / "wire.f64"
    env = dict(os.environ, MILLISERVE_HTTP__WIRE_TIMING_FILE=str(log))
    with ServerProcess(example_repo, env=env) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
        trips = []
        for _ in range(20):
            t0 = time.monotonic()
            conn.request("POST", "/v2/models/fraud_mlp/infer", BODY, {"Content-Type": "application/json"})
            assert conn.getresponse().read() and time.monotonic() > t0
            trips.append((t0, time.monotonic()))
        conn.close()
        # the bench's open loop, in a worker process: its sends and the server's reads line up
        pool = WorkerPool(build_workload(parse_target(f"http://{srv.http_url}"), "fraud_mlp"), 1)
        try:
            rec = pool.run_job("open", 200.0, 1.0, poisson=False, warmup_s=0.2)
        finally:
            pool.close()
    pairs = read_wire_log(log)  # flushed at the stop (SIGTERM)
    assert (pairs[:, 0] <= pairs[:, 1]).all()
    for t0, t1 in trips:
        inside = pairs[(pairs[:, 0] >= t0) & (pairs[:, 1] <= t1)]
        assert len(inside) == 1, (t0, t1, inside)
    assert (rec.status == 200).all() and len(rec) >= 200
    # every bench request: sent <= the server read it <= it answered <= the answer arrived
    first = np.sort(pairs[:, 0])
    for sent, done in zip(rec.sent, rec.done, strict=True):
        i = np.searchsorted(first, sent)
        assert i < len(first) and first[i] <= done, (sent, done)
