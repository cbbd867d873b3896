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
    # the tool's own overhead, measured (how small it is: benchmarks/bench_truth.py)
    assert doc["calibration"]["null_server_p50_us"] > 0
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
        assert cold["load_s"] > 0 and cold["first_request_ms"] > 0
        assert 0 < cold["steady_p50_ms"] <= cold["steady_p99_ms"]
        assert 0 <= cold["requests_to_settle"] <= 400
        assert "cold start: ready" in r.stdout


def test_cold_start_needs_the_repository_api(server: ServerProcess) -> None:
    r = bench(
        f"http://{server.http_url}", "-m", "fraud_mlp", "--cold-start", "--no-calibrate", "--duration", "0.5"
    )
    assert r.returncode == 1 and "--model-control-mode explicit" in r.stderr


def test_llm_mode_against_milliserve_on_smollm2(llm_server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "llm.json"
    prompts = tmp_path / "prompts.txt"  # short ones: the server refuses what would miss its TTFT budget
    prompts.write_text("Say hello.\nName a colour.\nCount to three.\n")
    r = bench(
        f"http://{llm_server.http_url}/v1",
        "--llm",
        "--prompts",
        str(prompts),
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--max-tokens",
        "8",
        "--warmup",
        "0.2",
        "--no-calibrate",
        "--json",
        str(out),
        "--csv",
        str(tmp_path / "llm.csv"),
        "--plot",
        str(tmp_path / "plots"),
    )
    assert r.returncode == 0, r.stderr
    assert "concurrency 2" in r.stdout and "goodput" in r.stdout and "TTFT" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["model"] == "smollm2"  # asked of /v1/models
    assert doc["config"]["endpoint"] == "/v1/chat/completions" and doc["config"]["workers"] == 1
    one, two = doc["levels"]
    assert one["requests"] == one["ok"] == 2 and one["errors"] == {}, json.dumps(one)
    # two streams on a loaded 2-core machine may meet the server's TTFT budget: a refusal
    # (429) is the server's answer, counted as such
    assert two["requests"] == 2 and two["ok"] + sum(two["errors"].values()) == 2, json.dumps(two)
    assert all(k.startswith("http 429") for k in two["errors"]), two["errors"]
    for lv in (lv for lv in (one, two) if lv["ok"]):
        assert 0 < lv["output_tokens"]["mean"] <= 8 and lv["usage_reported"] == 1.0
        assert 0 < lv["ttft_ms"]["p50"] <= lv["e2e_ms"]["p50"]
        assert lv["output_tokens_per_s"] > 0 and lv["throughput"] > 0
        assert "server-timing.ttft" in lv["server"]  # milliserve's own account, from the last chunk
    assert (tmp_path / "llm.csv").read_text().startswith("target,mode,level")
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "ttft_cdf.png",
        "itl_cdf.png",
        "latency_vs_tokens_per_s.png",
    }


def test_llm_mode_reads_awkward_streams_and_counts_errors(tmp_path: Path) -> None:
    # the fake OpenAI server stands in for a real one here: it tests the client only
    # (CRLF, events split across writes, keep-alive comments, a 500 every third request)
    from milliserve.bench.fake_openai import fake_openai_process

    out = tmp_path / "llm.json"
    awkward = ("--tokens", "6", "--crlf", "--split", "--comments", "--error-every", "3")
    with fake_openai_process(*awkward) as url:
        r = bench(
            url, "--llm", "--endpoint", "completions", "--requests", "6", "--warmup", "0", "--json", str(out)
        )
    assert r.returncode == 0, r.stderr
    (lv,) = json.loads(out.read_text())["levels"]
    assert lv["requests"] == 6 and lv["ok"] == 4 and lv["output_tokens"]["mean"] == 6
    assert lv["errors"] == {"http 500: fake overload": 2}
    assert "2 × http 500: fake overload" in r.stdout
    assert json.loads(out.read_text())["calibration"]["null_server_ttft_p50_ms"] > 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--llm", "--shape", "x:1", "-m", "m"], 2, "--shape: not used with --llm"),
        (["--max-tokens", "8", "-m", "m"], 2, "--max-tokens: only with --llm"),
        (["--llm"], 1, "give --model"),
        (["--llm", "-m", "m", "--prompts", "builtin:poems"], 1, "unknown set"),
        (["--llm", "-m", "m", "--extra-body", "[1]"], 2, "is not a JSON object"),
    ],
)
def test_llm_mode_bad_arguments_fail_clearly(args: list[str], code: int, message: str) -> None:
    r = bench(f"http://127.0.0.1:{free_port()}", *args, "--no-calibrate", "--duration", "0.5")
    assert r.returncode == code, r.stdout + r.stderr
    assert message in r.stderr


def test_embeddings_mode_against_milliserve_on_minilm(tmp_path: Path) -> None:
    # a real embedding pipeline (tokenizer -> MiniLM -> pooling), the model found through
    # /v1/models, 4 texts per request, an open loop and a closed one. The encoder is FP32 as
    # written from the weights: what is measured is bench's road, not the variant optimize
    # ships (test_minilm_embed_optimized.py serves that), and a run of this file alone then
    # skips the minutes of the optimize build
    from milliserve.examples.minilm_embed import build_minilm_embed

    repo = tmp_path / "repo"
    build_minilm_embed(repo, optimized=False)
    with ServerProcess(repo) as srv:
        out = tmp_path / "emb.json"
        common = ("--embeddings", "-b", "4", "--warmup", "0.3", "--duration", "1", "--no-calibrate")
        r = bench(f"http://{srv.http_url}/v1", *common, "--rate", "20", "--json", str(out))
        assert r.returncode == 0, r.stderr
        assert "texts/s" in r.stdout and "20 req/s" in r.stdout
        doc = json.loads(out.read_text())
        assert doc["model"] == "minilm_embed" and doc["config"]["mode"] == "embeddings open"
        (lv,) = doc["levels"]
        assert lv["ok"] == lv["requests"] > 0 and lv["errors"] == {}, lv
        assert lv["inputs_per_s"] == pytest.approx(4 * lv["throughput"], rel=0.01)
        assert 0 < lv["latency_us"]["p50"] <= lv["latency_us"]["p99"]
        texts = tmp_path / "texts.txt"
        texts.write_text("first text\nsecond one\n")
        r = bench(
            f"http://{srv.http_url}",
            *common,
            "-m",
            "minilm_embed",
            "--data",
            str(texts),
            "--concurrency",
            "2",
        )
        assert r.returncode == 0, r.stderr
        assert "concurrency 2" in r.stdout
        # a model that does not embed: every request's error, counted
        r = bench(
            f"http://{srv.http_url}", "--embeddings", "-m", "ghost", "--no-calibrate", "--duration", "0.3"
        )
        assert r.returncode == 0 and "http 404" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--embeddings", "--shape", "x:1"], "--shape: not used with --embeddings"),
        (["--embeddings", "--max-tokens", "8"], "--max-tokens: only with --llm"),
        (["--extra-body", "{}", "-m", "m"], "--extra-body: only with --llm or --embeddings"),
        (["--embeddings", "--llm"], "not allowed with argument"),
    ],
)
def test_embeddings_mode_bad_arguments_fail_clearly(args: list[str], message: str) -> None:
    r = bench(f"http://127.0.0.1:{free_port()}", *args, "--no-calibrate", "--duration", "0.5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
