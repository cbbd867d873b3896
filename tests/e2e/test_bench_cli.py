"""`milliserve bench` end to end against a real milliserve, and its errors for bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from milliserve.testing import ServerProcess, free_port

pytestmark = pytest.mark.e2e


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "milliserve", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


def test_json_csv_and_plots(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    r = bench(
        f"http://{server.http_url}",
        "-m",
        "fraud_mlp",
        "--concurrency",
        "1,4",
        "--duration",
        "1",
        "--warmup",
        "0.3",
        "--workers",
        "2",
        "--metrics-url",
        server.metrics_url,
        "--json",
        str(out),
        "--csv",
        str(tmp_path / "r.csv"),
        "--plot",
        str(tmp_path / "plots"),
    )
    assert r.returncode == 0, r.stderr
    assert "concurrency 4" in r.stdout and "p99" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["tool"] == "milliserve bench" and doc["model"] == "fraud_mlp"
    assert doc["config"]["mode"] == "closed" and doc["machine"]["cores"] >= 1
    assert 0 < doc["calibration"]["null_server_p50_us"] < 5000  # the tool's own overhead, measured
    levels = doc["levels"]
    assert [lv["level"] for lv in levels] == [1, 4]
    for lv in levels:
        assert set(lv) >= {
            "mode",
            "level",
            "requests",
            "ok",
            "throughput",
            "latency_us",
            "errors",
            "late_sends",
            "client_cpu_share",
            "server",
            "stalls",
        }
        assert set(lv["latency_us"]) >= {"p50", "p90", "p95", "p99", "p99.9", "max"}
        assert lv["ok"] == lv["requests"] > 0 and lv["errors"] == {}
        assert lv["latency_us"]["p50"] <= lv["latency_us"]["p99"] <= lv["latency_us"]["max"]
        assert lv["server"]["avg_batch_size"] >= 1 and "queue_us" in lv["server"]
    assert (tmp_path / "r.csv").read_text().startswith("target,mode,level")
    import matplotlib.image as mpimg

    for name in ("latency_cdf.png", "percentiles_vs_throughput.png", "latency_over_time.png"):
        image = mpimg.imread(tmp_path / "plots" / name)
        assert image.shape[0] > 100 and image.shape[1] > 100


def test_open_loop_over_grpc(server: ServerProcess) -> None:
    r = bench(
        f"grpc://{server.grpc_url}", "-m", "fraud_mlp", "--rate", "200", "--duration", "1", "--warmup", "0.3"
    )
    assert r.returncode == 0, r.stderr
    assert "200 req/s" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["http://127.0.0.1:{free}", "-m", "fraud_mlp"], "cannot reach"),
        (["http://{http}", "-m", "ghost"], "answered 404"),
        (
            ["http://{http}", "-m", "fraud_mlp", "--shape", "features:63"],
            "does not match the model's [-1, 64]",
        ),
        (["http://{http}", "-m", "fraud_mlp", "--rate", "0"], "--rate values must be > 0"),
        (["ftp://{http}", "-m", "fraud_mlp"], "must look like http://host:port or grpc://host:port"),
        (["http://{http}", "-m", "minilm"], "give them with --shape input_ids:DIMS"),
    ],
)
def test_bad_arguments_fail_clearly(server: ServerProcess, args: list[str], message: str) -> None:
    filled = [a.format(free=free_port(), http=server.http_url) for a in args]
    r = bench(*filled, "--duration", "0.5")
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stderr


def test_cold_start_through_the_repository_api(example_repo: Path, tmp_path: Path) -> None:
    with ServerProcess(example_repo, "--model-control-mode", "explicit", "--load-model", "fraud_mlp") as srv:
        out = tmp_path / "cold.json"
        r = bench(
            f"http://{srv.http_url}",
            "-m",
            "fraud_mlp",
            "--cold-start",
            "--no-calibrate",
            "--duration",
            "0.5",
            "--warmup",
            "0.2",
            "--json",
            str(out),
        )
        assert r.returncode == 0, r.stderr
        cold = json.loads(out.read_text())["cold_start"]
        assert 0 < cold["load_s"] < 30 and cold["first_request_ms"] > 0
        assert 0 < cold["steady_p50_ms"] <= cold["steady_p99_ms"]
        assert 0 <= cold["requests_to_settle"] <= 400
        assert "cold start: ready" in r.stdout


def test_cold_start_needs_the_repository_api(server: ServerProcess) -> None:
    r = bench(
        f"http://{server.http_url}", "-m", "fraud_mlp", "--cold-start", "--no-calibrate", "--duration", "0.5"
    )
    assert r.returncode == 1 and "--model-control-mode explicit" in r.stderr
