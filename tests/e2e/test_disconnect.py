"""An HTTP client that disconnects before its answer takes its request with it: a queued
tensor request leaves the queue and is never computed, and it is counted as cancelled (as
gRPC's cancellation already was). The server logs no error for it and keeps serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from milliserve.testing import ServerProcess, wait_until
from tests.support.probes import pending_requests

pytestmark = pytest.mark.e2e

# one instance, no batching, every batch stalled 3 s: a request held by the instance keeps the
# others queued long enough for their clients to leave
STALLED = """
name: "stalled"
max_batch_size: 4
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "test_stall_ms" value: { string_value: "3000" } }
"""

BODY = {
    "inputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]} for n in ("INPUT0", "INPUT1")
    ]
}
GONE = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, write_add_sub: Any) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("disconnect")
    write_add_sub(repo, name="stalled", config=STALLED, dims=("batch", 2))
    with ServerProcess(repo) as proc:
        yield proc


def _stats(server: ServerProcess) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"http://{server.http_url}/v2/models/stalled/stats").json()
    return stats["model_stats"][0]


def _send_and_keep(server: ServerProcess) -> socket.socket:
    """A client that sends a whole request and then waits (it will leave without reading)."""
    host, port = server.http_url.rsplit(":", 1)
    body = json.dumps(BODY).encode()
    head = (
        f"POST /v2/models/stalled/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(head + body)
    return sock


def test_requests_of_clients_that_left_are_never_computed(server: ServerProcess) -> None:
    pending = lambda: sum(pending_requests(server.metrics_url, "stalled").values())  # noqa: E731
    before = _stats(server)
    with ThreadPoolExecutor(1) as pool:
        # a client that stays: its request holds the only instance for 3 s
        stays = pool.submit(
            httpx.post, f"http://{server.http_url}/v2/models/stalled/infer", json=BODY, timeout=60
        )
        wait_until(lambda: pending() >= 1, 30, "the first request running")
        leaving = [_send_and_keep(server) for _ in range(GONE)]
        wait_until(lambda: pending() >= 1 + GONE, 30, "the others queued behind it")
        for sock in leaving:
            sock.close()
        wait_until(lambda: pending() <= 1, 30, "the requests of the clients that left out of the queue")
        answer = stays.result()
    assert answer.status_code == 200, answer.text
    after = _stats(server)
    # only the request whose client stayed was computed
    assert after["inference_count"] - before["inference_count"] == 1
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == GONE
    cancelled = [
        sample.value
        for family in text_string_to_metric_families(httpx.get(server.metrics_url).text)
        for sample in family.samples
        if sample.name == "milliserve_inference_request_failure_total"
        and sample.labels.get("model") == "stalled"
        and sample.labels.get("reason") == "CANCELED"
    ]
    assert cancelled == [GONE]
    assert "Exception in ASGI application" not in server.logs()
    # and the server goes on serving
    again = httpx.post(f"http://{server.http_url}/v2/models/stalled/infer", json=BODY, timeout=60)
    assert again.status_code == 200 and again.json()["outputs"][0]["data"] == [2.0, 4.0]
