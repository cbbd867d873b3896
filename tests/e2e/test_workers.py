"""``milliserve serve --workers N`` for real: worker processes behind the same HTTP and
gRPC ports, one metrics endpoint and summed statistics, a killed worker restarted (and
costing only what it held), and SIGTERM draining every worker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from milliserve.testing import ServerProcess, free_port, wait_until
from tests.support.probes import pending_requests, post_status, slow_body

pytestmark = pytest.mark.e2e

X = np.zeros((1, 64), np.float32)
BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}


def serving(srv: ServerProcess) -> int:
    """Workers that said they serve (the parent logs each)."""
    return len(re.findall(r"worker \d+: serving", srv.logs()))


def per_worker(srv: ServerProcess, metric: str = "milliserve_inference_count_total") -> dict[str, float]:
    """``metric`` of fraud_mlp per worker label, from the one metrics endpoint."""
    out: dict[str, float] = {}
    for line in httpx.get(srv.metrics_url, timeout=10).text.splitlines():
        m = re.match(rf'{metric}{{worker="(\d+)",model="fraud_mlp",version="1"}} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def worker_pids(srv: ServerProcess) -> list[int]:
    assert srv.proc is not None
    children = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    return [int(p) for p in children]


@pytest.fixture(scope="module")
def two(example_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(example_repo, "--workers", "2") as srv:
        wait_until(lambda: serving(srv) >= 2, 60, "both workers serving")
        yield srv


def _fresh_connection_calls(srv: ServerProcess, n: int) -> list[int]:
    """n requests, each on its own connection: the kernel hands each to whichever worker
    accepts first."""
    codes = []
    for _ in range(n):
        with httpx.Client(timeout=30) as c:
            codes.append(c.post(f"http://{srv.http_url}/v2/models/fraud_mlp/infer", json=BODY).status_code)
    return codes


def test_both_workers_take_connections_on_the_shared_ports(two: ServerProcess) -> None:
    def spread() -> bool:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: _fresh_connection_calls(two, 5), range(4)))
        counts = per_worker(two)
        return len(counts) == 2 and min(counts.values()) > 0

    wait_until(spread, 120, "requests answered by both workers", interval_s=0.1)
    # gRPC: one port, shared through SO_REUSEPORT; every call answered
    for _ in range(8):
        with grpcclient.InferenceServerClient(two.grpc_url) as g:
            inp = grpcclient.InferInput("features", [1, 64], "FP32")
            inp.set_data_from_numpy(X)
            assert g.infer("fraud_mlp", [inp]).as_numpy("probabilities").shape == (1, 2)


def test_statistics_are_summed_and_metrics_labelled_per_worker(two: ServerProcess) -> None:
    before = sum(per_worker(two).values())
    _fresh_connection_calls(two, 12)
    counts = per_worker(two)
    assert sum(counts.values()) == before + 12
    stats = httpx.get(f"http://{two.http_url}/v2/models/fraud_mlp/stats").json()["model_stats"]
    assert len(stats) == 1 and stats[0]["inference_count"] == sum(counts.values())
    everything = httpx.get(f"http://{two.http_url}/v2/models/stats").json()["model_stats"]
    assert [s["inference_count"] for s in everything if s["name"] == "fraud_mlp"] == [sum(counts.values())]
    with grpcclient.InferenceServerClient(two.grpc_url) as g:
        got = g.get_inference_statistics("fraud_mlp", as_json=True)["model_stats"][0]
        assert int(got["inference_count"]) == sum(counts.values())
    with httpclient.InferenceServerClient(two.http_url) as h:
        got = h.get_inference_statistics("fraud_mlp")["model_stats"][0]
        assert got["inference_count"] == sum(counts.values())
    # the HTTP port's /metrics is the same merged view, each family's HELP once
    text = httpx.get(f"http://{two.http_url}/metrics").text
    assert text.count("# HELP milliserve_inference_count_total ") == 1
    assert 'milliserve_inference_count_total{worker="1",model="fraud_mlp"' in text


def test_a_killed_worker_costs_only_what_it_held_and_comes_back(example_repo: Path) -> None:
    with ServerProcess(example_repo, "--workers", "2") as srv:
        wait_until(lambda: serving(srv) >= 2, 60, "both workers serving")
        stop = False
        codes: list[int | str] = []

        def load() -> None:
            with httpx.Client(timeout=30) as c:  # keep-alive: the victim holds some connections
                while not stop:
                    try:
                        r = c.post(f"http://{srv.http_url}/v2/models/fraud_mlp/infer", json=BODY)
                        codes.append(r.status_code)
                    except httpx.HTTPError as exc:
                        codes.append(type(exc).__name__)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(load) for _ in range(4)]
            wait_until(lambda: len(codes) > 200, 60, "load running")
            victim = worker_pids(srv)[1]
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: serving(srv) >= 3, 90, "the killed worker restarted and serving")
            seen = len(codes)
            wait_until(lambda: len(codes) > seen + 200, 60, "load after the restart")
            stop = True
            for f in futures:
                f.result()
        failed = [c for c in codes if c != 200]
        # each of the 4 clients can lose at most the request in flight on the victim
        assert len(failed) <= 4, failed[:10]
        assert all(c == 200 for c in codes[seen:]), "failures after the restart"
        assert "worker 1 exited with -9: restarting" in srv.logs()
        assert len(worker_pids(srv)) == 2


def test_sigterm_drains_every_worker(tmp_path: Path, write_slow: Callable[..., Path]) -> None:
    write_slow(
        tmp_path,
        config='name: "slow"\nmax_batch_size: 4\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n',
        steps=600,  # long enough for all 8 to be held before the first batch ends
    )
    srv = ServerProcess(tmp_path, "--workers", "2").start()
    assert srv.proc is not None
    wait_until(lambda: serving(srv) >= 2, 60, "both workers serving")
    url = f"http://{srv.http_url}/v2/models/slow/infer"

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(post_status, url, slow_body()) for _ in range(8)]
        # a request not yet connected at SIGTERM is refused (rightly): wait until all are held
        held = lambda: sum(pending_requests(srv.metrics_url, "slow").values())  # noqa: E731
        wait_until(lambda: held() >= 8, 60, "all 8 held")
        srv.proc.send_signal(signal.SIGTERM)
        codes = [f.result() for f in futures]
    assert codes == [200] * 8
    assert srv.proc.wait(60) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{srv.http_url}/v2/health/live")


def test_a_worker_that_cannot_start_stops_the_server(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "milliserve",
            "serve",
            str(tmp_path / "missing"),
            "--workers",
            "2",
            "--http-port",
            str(port),
            "--grpc-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "before it served: stopping" in done.stderr


def test_the_shared_grpc_port_is_not_open_to_another_server(two: ServerProcess, example_repo: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "milliserve",
            "serve",
            str(example_repo),
            "--http-port",
            str(free_port()),
            "--grpc-port",
            str(two.grpc_port),
            "--metrics-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "already in use" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 120


def test_with_a_token_statistics_are_still_summed(example_repo: Path) -> None:
    """The siblings' private ports ask for the token too: the worker asking sends it."""
    token = {"Authorization": "Bearer s3cret"}
    env = dict(os.environ, MILLISERVE_AUTH__PROTECT_METRICS="true")
    with ServerProcess(example_repo, "--workers", "2", "--auth-token", "s3cret", env=env) as srv:
        wait_until(lambda: serving(srv) >= 2, 60, "both workers serving")
        url = f"http://{srv.http_url}/v2/models/fraud_mlp/infer"
        for _ in range(12):
            with httpx.Client(timeout=30, headers=token) as c:
                assert c.post(url, json=BODY).status_code == 200
        stats = httpx.get(f"http://{srv.http_url}/v2/models/fraud_mlp/stats", headers=token).json()
        text = httpx.get(f"http://{srv.http_url}/metrics", headers=token).text
    counts = re.findall(
        r'milliserve_inference_count_total\{worker="(\d)",model="fraud_mlp",version="1"\} (\S+)', text
    )
    assert {w for w, _ in counts} == {"0", "1"}
    assert stats["model_stats"][0]["inference_count"] == sum(float(n) for _, n in counts) >= 12


def test_a_port_another_server_shares_is_refused(example_repo: Path) -> None:
    """A gRPC server elsewhere that set SO_REUSEPORT must not be joined."""
    import socket

    port = free_port()
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", port))
    other.listen()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "milliserve", "serve", str(example_repo), "--workers", "2",
             "--http-port", str(free_port()), "--grpc-port", str(port), "--metrics-port", str(free_port())],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        other.close()
    assert done.returncode != 0 and "already in use" in done.stderr, done.stderr[-2000:]


def test_explicit_model_control_is_refused_with_workers(example_repo: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "milliserve", "serve", str(example_repo), "--workers", "2",
         "--model-control-mode", "explicit", "--http-port", str(free_port())],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "--model-control-mode explicit" in done.stderr, done.stderr[-2000:]
