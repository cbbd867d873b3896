"""Real-server behaviour: repository API, overload, timeouts, graceful shutdown, metrics."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from milliserve.testing import ServerProcess, wait_until
from tests.support.probes import pending_requests, slow_body

pytestmark = pytest.mark.e2e

SLOW_QUEUE = """
name: "slow"
max_batch_size: 4
dynamic_batching { default_queue_policy { max_queue_size: 2 } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def pending(srv: ServerProcess, model: str = "slow") -> float:
    """Requests the server holds for ``model`` (queued or running), from its metrics."""
    return sum(pending_requests(srv.metrics_url, model).values())


def test_repository_api_over_http_and_grpc(example_repo: Path) -> None:
    with ServerProcess(example_repo, "--model-control-mode", "explicit", "--load-model", "fraud_mlp") as srv:
        h = httpclient.InferenceServerClient(srv.http_url)
        g = grpcclient.InferenceServerClient(srv.grpc_url)
        states = {m["name"]: m.get("state") for m in h.get_model_repository_index()}
        names = ("minilm", "fraud", "sentiment", "sentiment_model", "sentiment_fast", "sentiment_cascade")
        on_disk = dict.fromkeys(names)
        assert states == {"fraud_mlp": "READY", **on_disk}  # on disk, never loaded
        g.load_model("minilm")
        assert h.is_model_ready("minilm")
        h.unload_model("fraud_mlp")
        assert not g.is_model_ready("fraud_mlp")
        with pytest.raises(InferenceServerException) as err:
            inp = grpcclient.InferInput("features", [1, 64], "FP32")
            inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
            g.infer("fraud_mlp", [inp])
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        g.unload_model("minilm")
        h.load_model("fraud_mlp")
        assert g.is_model_ready("fraud_mlp")
        with pytest.raises(InferenceServerException) as err:
            h.load_model("no_such_model")
        assert err.value.status() == "404"
        h.close()
        g.close()


def test_full_queue_answers_503_and_unavailable_at_once(
    tmp_path: Path, write_slow: Callable[..., Path]
) -> None:
    write_slow(tmp_path, config=SLOW_QUEUE)
    with ServerProcess(tmp_path) as srv:
        url = f"http://{srv.http_url}/v2/models/slow/infer"
        with ThreadPoolExecutor(12) as pool, httpx.Client(timeout=60) as c:
            resps = list(pool.map(lambda _: c.post(url, json=slow_body(4)), range(12)))
        codes = [r.status_code for r in resps]
        assert codes.count(200) >= 3 and codes.count(503) >= 1, codes
        rejected = next(r for r in resps if r.status_code == 503)
        assert "max_queue_size 2" in rejected.json()["error"]
        assert set(codes) <= {200, 503}
        # and over gRPC
        g = grpcclient.InferenceServerClient(srv.grpc_url)
        x = np.ones((4, 256, 256), np.float32)
        errors: list[str] = []
        done: list[int] = []

        def cb(result: object, error: InferenceServerException | None) -> None:
            (errors.append(error.status()) if error else done.append(1))

        for _ in range(12):
            inp = grpcclient.InferInput("X", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            g.async_infer("slow", [inp], cb)
        deadline = time.monotonic() + 60
        while len(errors) + len(done) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        g.close()
        assert "StatusCode.UNAVAILABLE" in errors and done


def test_request_timeout_that_cannot_be_met_is_refused_at_once(
    tmp_path: Path, write_slow: Callable[..., Path]
) -> None:
    """The OIP ``timeout`` is a deadline: with full batches queued ahead, a 1 ms request is
    refused at once (429) instead of waiting to time out. (Queue expiry itself, 504, is a
    batcher unit test.)"""
    write_slow(tmp_path, config=SLOW_QUEUE.replace("max_queue_size: 2", "max_queue_size: 8"))
    with ServerProcess(tmp_path) as srv:
        url = f"http://{srv.http_url}/v2/models/slow/infer"
        quick = slow_body(1) | {"parameters": {"timeout": 1000}}  # 1 ms
        with ThreadPoolExecutor(4) as pool, httpx.Client(timeout=60) as c:
            busy = [pool.submit(c.post, url, json=slow_body(4)) for _ in range(4)]
            wait_until(lambda: pending(srv) >= 4)  # the instance works through full batches
            r = c.post(url, json=quick)
            # answered at once, while the queue it would have waited behind is still there
            still_busy = sum(not b.done() for b in busy)
            assert [b.result().status_code for b in busy] == [200] * 4
        assert r.status_code == 429 and "would miss its deadline" in r.json()["error"]
        assert still_busy > 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sigterm_finishes_requests_in_flight_then_exits(
    tmp_path: Path, write_slow: Callable[..., Path], protocol: str
) -> None:
    """SIGTERM as soon as the first of 6 concurrent requests reached the model: the others are
    still on the wire or being read. Every one is answered (gRPC used to cancel the calls it
    had received but not yet started), then the server exits 0.

    Each client connects before the signal: one that had not called connect() yet (its thread
    not scheduled, on a loaded machine) finds the listener closed, as it would on any server."""
    write_slow(tmp_path, config=SLOW_QUEUE.replace("max_queue_size: 2", "max_queue_size: 16"))
    srv = ServerProcess(tmp_path).start()
    assert srv.proc is not None
    x = np.ones((1, 256, 256), np.float32)
    connected = threading.Semaphore(0)
    body = json.dumps(slow_body(1)).encode()

    def call(_: int) -> str:
        if protocol == "http":
            host, port = srv.http_url.split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                conn.connect()
                connected.release()
                conn.request("POST", "/v2/models/slow/infer", body, {"Content-Type": "application/json"})
                return str(conn.getresponse().status)
            finally:
                conn.close()
        with grpcclient.InferenceServerClient(srv.grpc_url) as g:
            inp = grpcclient.InferInput("X", [1, 256, 256], "FP32")
            inp.set_data_from_numpy(x)
            assert g.is_server_live()  # the channel's connection is up
            connected.release()
            try:
                g.infer("slow", [inp], client_timeout=60)
            except InferenceServerException as exc:
                return str(exc.status())
            return "200"

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(call, i) for i in range(6)]
        for _ in range(6):
            assert connected.acquire(timeout=60), "a client could not connect"
        wait_until(lambda: pending(srv) >= 1)
        srv.proc.send_signal(signal.SIGTERM)
        codes = [f.result() for f in futures]
    assert codes == ["200"] * 6
    assert srv.proc.wait(30) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{srv.http_url}/v2/health/live")


def test_metrics_endpoint_reports_batching_and_durations(server: ServerProcess) -> None:
    x = np.zeros((1, 64), np.float32)
    with httpclient.InferenceServerClient(server.http_url, concurrency=8) as h:
        inp = httpclient.InferInput("features", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        reqs = [h.async_infer("fraud_mlp", [inp]) for _ in range(64)]
        for r in reqs:
            r.get_result()
    text = httpx.get(server.metrics_url).text
    labels = '{model="fraud_mlp",version="1"}'
    for name in (
        "milliserve_inference_request_success_total",
        "milliserve_inference_count_total",
        "milliserve_inference_exec_count_total",
        "milliserve_queue_duration_seconds_bucket",
        "milliserve_compute_infer_duration_seconds_count",
        "milliserve_compute_input_duration_seconds_count",
        "milliserve_compute_output_duration_seconds_count",
        "milliserve_batch_size_bucket",
        "milliserve_pending_request_count",
        "milliserve_model_load_duration_seconds",
        "milliserve_model_first_request_duration_seconds",
    ):
        assert name in text, name
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("milliserve_") and labels in line and "_bucket" not in line
    }
    assert values[f"milliserve_inference_count_total{labels}"] >= 64
    assert (
        values[f"milliserve_inference_exec_count_total{labels}"]
        <= values[f"milliserve_inference_count_total{labels}"]
    )


def test_bad_command_line_fails_clearly(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "milliserve", "serve", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "is not a directory" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "milliserve", "serve"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "MODEL_REPOSITORY" in r.stderr


def _executions(c: httpx.Client, base: str) -> int:
    return int(c.get(f"{base}/v2/models/slow/stats").json()["model_stats"][0]["execution_count"])


def test_deadlines_from_header_grpc_and_budget(tmp_path: Path, write_slow: Callable[..., Path]) -> None:
    """A request that cannot finish in time gets 429 / DEADLINE_EXCEEDED without being run;
    one that can is served. Without a deadline of its own, the budget's p99 applies."""
    write_slow(tmp_path, config=SLOW_QUEUE)
    write_slow(
        tmp_path,
        name="budgeted",
        config=SLOW_QUEUE.replace('"slow"', '"budgeted"') + "budget { p99_ms: 1 }\n",
    )
    with ServerProcess(tmp_path) as srv, httpx.Client(timeout=60) as c:
        base = f"http://{srv.http_url}"
        url = f"{base}/v2/models/slow/infer"
        assert c.post(url, json=slow_body(1)).status_code == 200  # teaches the estimator
        before = _executions(c, base)
        r = c.post(url, json=slow_body(1), headers={"x-request-deadline-ms": "0.5"})
        assert r.status_code == 429 and "would miss its deadline" in r.json()["error"]
        assert _executions(c, base) == before  # refused without spending compute on it
        assert c.post(url, json=slow_body(1), headers={"x-request-deadline-ms": "5000"}).status_code == 200
        bad = c.post(url, json=slow_body(1), headers={"x-request-deadline-ms": "soon"})
        assert bad.status_code == 400 and "x-request-deadline-ms" in bad.json()["error"]

        budgeted = c.post(f"{base}/v2/models/budgeted/infer", json=slow_body(1))
        assert budgeted.status_code == 429 and "would miss its deadline" in budgeted.json()["error"]

        with grpcclient.InferenceServerClient(srv.grpc_url) as g:
            x = grpcclient.InferInput("X", [1, 256, 256], "FP32")
            x.set_data_from_numpy(np.ones((1, 256, 256), np.float32))
            with pytest.raises(InferenceServerException) as err:
                g.infer("slow", [x], client_timeout=0.02)  # 20 ms: less than one run of the model
            assert "DEADLINE_EXCEEDED" in str(err.value.status()) and "would miss" in str(err.value.message())
            assert g.infer("slow", [x], client_timeout=30).as_numpy("Y").shape == (1, 256, 256)
