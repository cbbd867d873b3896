"""The embeddings mode (``milliserve bench --embeddings``) against the fake OpenAI server's
``/v1/embeddings`` (milliserve.bench.fake_openai, a subprocess on a free port), whose delay
we choose: what it sends, what it reports, and that it goes through the same load generator
as the other modes (open loop from the schedule, errors counted, A/B)."""

from __future__ import annotations

import io

import orjson
import pytest
from rich.console import Console

from milliserve.bench.embeddings_workload import BUILTIN_TEXTS, build_embeddings_workload, load_texts
from milliserve.bench.fake_openai import fake_openai_process
from milliserve.bench.openai_target import parse_api_target
from milliserve.bench.results import LevelResult
from milliserve.bench.run_report import print_report
from milliserve.bench.runner import BenchConfig, run_bench
from milliserve.errors import ConfigError


def body(raw: bytes) -> dict[str, object]:
    doc: dict[str, object] = orjson.loads(raw.split(b"\r\n\r\n", 1)[1])
    return doc


def test_requests_carry_k_texts_round_robin_and_the_extra_body_last() -> None:
    target = parse_api_target("http://127.0.0.1:8000/v1")
    w = build_embeddings_workload(target, "e", ["a", "b", "c"], inputs=2, extra_body={"dimensions": 64})
    assert [body(r)["input"] for r in w.requests] == [["a", "b"], ["c", "a"]]
    doc = body(w.requests[0])
    assert doc["model"] == "e" and doc["encoding_format"] == "float" and doc["dimensions"] == 64
    assert w.requests[0].startswith(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert len(load_texts("builtin")) == len(BUILTIN_TEXTS) >= 16


@pytest.mark.parametrize(
    ("url", "inputs", "message"),
    [
        ("https://127.0.0.1:8000", 1, "speaks plain HTTP"),
        ("http://127.0.0.1:8000", 0, "give 1 to 2048 texts per request"),
        ("http://127.0.0.1:8000", 2049, "give 1 to 2048 texts per request"),
    ],
)
def test_bad_workloads_are_named(url: str, inputs: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_embeddings_workload(parse_api_target(url), "e", ["a"], inputs=inputs)


def test_a_level_reports_latency_requests_and_texts_per_second() -> None:
    with fake_openai_process("--embed-ms", "3") as url:
        cfg = BenchConfig(url, mode="embeddings", batch=4, rates=[100.0], duration_s=1.5, warmup_s=0.3)
        report = run_bench(cfg)
    (lv,) = report.levels
    assert isinstance(lv, LevelResult) and cfg.model == "fake-embed"  # the first of /v1/models that embeds
    assert lv.ok == lv.requests > 100 and lv.errors == {}
    assert lv.latency_us["p50"] >= 0.9 * 3000  # the server's 3 ms sleep is a floor
    assert lv.inputs_per_s == pytest.approx(4 * lv.throughput)
    doc = report.as_dict()
    assert doc["config"]["mode"] == "embeddings open" and doc["config"]["inputs_per_request"] == 4
    assert doc["levels"][0]["inputs_per_s"] == pytest.approx(4 * doc["levels"][0]["throughput"], rel=0.01)
    assert doc["calibration"]["null_server_p50_us"] > 0
    out = io.StringIO()
    print_report(report, Console(file=out, width=250))
    assert "texts/s" in out.getvalue() and "/v1/embeddings, 4 text(s) per request" in out.getvalue()


def test_errors_are_counted_and_the_comparison_runs() -> None:
    with fake_openai_process("--error-every", "4") as a, fake_openai_process("--embed-ms", "4") as b:
        cfg = BenchConfig(
            a, mode="embeddings", concurrency=[1], duration_s=0.5, warmup_s=0.1, compare_url=b, rounds=1
        )
        cfg.calibrate = False
        report = run_bench(cfg)
    (lv,) = report.levels
    assert lv.errors == {
        "http 500: " + '{"error":{"message":"fake overload","type":"server_error","code":500}}': lv.requests
        - lv.ok
    }
    assert 0.15 <= (lv.requests - lv.ok) / lv.requests <= 0.35
    (row,) = report.compare
    assert row["b"]["p50"] >= 0.9 * 4000 > row["a"]["p50"]
