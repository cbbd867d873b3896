"""milliserve replicas on a real local Ray cluster (``ray start --head`` on 127.0.0.1,
started and stopped here), deployed by ``milliserve ray serve``: tritonclient answers
through Ray Serve's proxy, the app scales from 1 to 2 replicas under load without a failed
request, a replica is never sent traffic before its models are warm, a killed replica costs
only the requests it held, and deleting the app lets replicas finish what they hold."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from milliserve.config.settings import ray_env
from milliserve.testing import free_port, wait_until
from tests.support.probes import pending_requests, post_status, slow_body

pytestmark = pytest.mark.e2e

pytest.importorskip("ray.serve", reason="the [ray] extra is needed")

BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
# the slow model's warm-up makes a replica's start take seconds: long enough to see that no
# request reaches it before it is warm
SLOW = """
name: "slow"
max_batch_size: 4
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
model_warmup [ { name: "w" batch_size: 1 count: 40
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 256, 256 ] zero_data: true } } } ]
"""


def _env() -> dict[str, str]:
    # a CI machine is a small, busy node: Serve's proxy may need more than its default 5 s to
    # start (docs/deploy.md), and was killed and replaced mid-deploy under two CPU burners
    return dict(os.environ, **ray_env(), RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S="30")


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A one-node Ray cluster on loopback; its GCS address."""
    port = free_port()
    cmd = [
        _ray(), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
        "--include-dashboard=false", "--num-cpus=2", "--object-store-memory=134217728",
        "--disable-usage-stats",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([_ray(), "stop", "--force"], env=_env(), capture_output=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def repo(example_repo: Path, tmp_path_factory: pytest.TempPathFactory, write_slow: Any) -> Path:
    repo = tmp_path_factory.mktemp("ray-repo")
    shutil.copytree(example_repo / "fraud_mlp", repo / "fraud_mlp")
    write_slow(repo, config=SLOW, steps=100)
    return repo


class RayApp:
    def __init__(self, repo: Path, address: str, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.log = log
        cmd = [
            sys.executable, "-m", "milliserve", "ray", "serve", str(repo), "--address", address,
            "--http-port", str(self.port), "--min-replicas", "1", "--max-replicas", "2",
            "--target-ongoing-requests", "2", "--upscale-delay-s", "1", "--downscale-delay-s", "600",
            "--num-cpus", "0.5", *extra,
        ]  # fmt: skip
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        wait_until(self._ready, 240, "the Ray Serve app answering", interval_s=0.2)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(f"http://{self.url}/v2/health/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def app(cluster: str, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayApp]:
    served = RayApp(repo, cluster, tmp_path_factory.mktemp("ray-log") / "serve.log")
    try:
        yield served
    finally:
        served.stop()


def replicas() -> list[int]:
    """The PIDs of this machine's milliserve Serve replicas (Ray names their processes)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"ServeReplica:milliserve" in (proc / "cmdline").read_bytes():
                    out.append(int(proc.name))
            except OSError:
                pass
    return sorted(out)


def started_at(pid: int) -> float:
    """A process's start, in seconds since the epoch."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime")
    )
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class Load:
    """``clients`` closed loops of fraud_mlp requests; every answer recorded."""

    def __init__(self, url: str, clients: int) -> None:
        self.url, self.stop = url, threading.Event()
        self.results: list[tuple[float, int | str, int]] = []  # (time, status, replica pid)
        self.warmth: dict[int, tuple[float, float]] = {}  # replica pid: (warm at, cold start s)
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        with httpx.Client(timeout=60) as c:
            while not self.stop.is_set():
                try:
                    r = c.post(f"http://{self.url}/v2/models/fraud_mlp/infer", json=BODY)
                    pid = int(r.headers.get("x-milliserve-replica", "0"))
                    if pid and pid not in self.warmth:
                        self.warmth[pid] = (
                            float(r.headers["x-milliserve-replica-warm-at"]),
                            float(r.headers["x-milliserve-replica-cold-start-s"]),
                        )
                    self.results.append((time.time(), r.status_code, pid))
                except httpx.HTTPError as exc:
                    self.results.append((time.time(), type(exc).__name__, 0))

    def finish(self) -> list[tuple[float, int | str, int]]:
        self.stop.set()
        for t in self.threads:
            t.join(120)
        return self.results


def test_tritonclient_answers_through_ray_serve(app: RayApp) -> None:
    with httpclient.InferenceServerClient(app.url) as c:
        assert c.is_server_ready() and c.is_model_ready("fraud_mlp")
        inp = httpclient.InferInput("features", [2, 64], "FP32")
        inp.set_data_from_numpy(np.zeros((2, 64), np.float32))
        out = c.infer("fraud_mlp", [inp]).as_numpy("probabilities")
        assert out.shape == (2, 2) and np.allclose(out.sum(1), 1, atol=1e-5)
        assert c.get_model_metadata("fraud_mlp")["name"] == "fraud_mlp"
    r = httpx.get(f"http://{app.url}/v2/models/nope")
    assert r.status_code == 404 and "nope" in r.json()["error"]


def test_scales_to_two_replicas_under_load_warm_before_traffic_and_without_failures(app: RayApp) -> None:
    (first_replica,) = replicas()
    load = Load(app.url, 8)
    try:
        wait_until(lambda: len(replicas()) == 2, 180, "a second replica", interval_s=0.1)
        appeared = time.time()
        (new,) = set(replicas()) - {first_replica}
        wait_until(lambda: any(pid == new for _, _, pid in load.results), 180, "traffic on the new replica")
    finally:
        results = load.finish()
    assert all(status == 200 for _, status, _ in results), {s for _, s, _ in results if s != 200}
    first_answer = min(t for t, _, pid in results if pid == new)
    # the replica's own account of when it was warm, from its answers under the load (sequential
    # requests after the load may all land on the old replica: Ray's router only sees queues)
    warm_at, cold = load.warmth[new]
    assert first_answer >= warm_at, "a request reached the replica before its models were warm"
    print(
        f"\nnew replica: cold start (created to warm) {cold:.2f} s; its process seen to its first "
        f"answer {first_answer - appeared:.2f} s"
    )


def test_a_killed_replica_costs_only_what_it_held(app: RayApp) -> None:
    wait_until(lambda: len(replicas()) == 2, 180, "two replicas")
    load = Load(app.url, 4)
    try:
        wait_until(lambda: len(load.results) > 100, 60, "load running")
        victim = replicas()[0]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in replicas() and len(replicas()) == 2, 180, "a replacement replica")
        replaced_at = time.time()
        wait_until(lambda: sum(t > replaced_at for t, _, _ in load.results) > 100, 120, "load after")
    finally:
        results = load.finish()
    failed = [(t, s) for t, s, _ in results if s != 200]
    print(
        f"\nreplica killed under 4 clients: {len(failed)} failed requests; "
        f"replaced in {replaced_at - killed_at:.1f} s"
    )
    # at most what the victim held: one request per client at the moment of the kill
    assert len(failed) <= 4, failed
    assert all(t <= replaced_at for t, _ in failed)


def test_deleting_the_app_lets_replicas_finish_what_they_hold(app: RayApp) -> None:
    """Last in this module: it deletes the app (the CLI's SIGTERM), under slow requests."""
    codes: list[int | str] = []

    def call() -> None:
        codes.append(post_status(f"http://{app.url}/v2/models/slow/infer", slow_body()))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()

    def held() -> bool:  # one replica's view per scrape
        return sum(pending_requests(f"http://{app.url}/metrics", "slow").values()) >= 1

    wait_until(held, 60, "slow requests in a replica", interval_s=0.05)
    assert app.stop() == 0
    for t in threads:
        t.join(120)
    assert codes == [200] * 4, codes
    assert replicas() == []
