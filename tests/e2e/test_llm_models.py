"""Several GGUF models behind one port, loaded on demand (``--llm-memory-mib``): the
smollm2 example's GGUF under two model names. Each loads on its first request (whose
Server-Timing says how long the load took, and whose TTFT, load included, is its own
metric); an idle model unloads, least recently used first, when loading another would pass
the cap; a model with a request running is never unloaded; /v1/models lists every one
with its status; concurrent first requests load a model once."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from milliserve.drills.llm_attacks import metric
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

NAMES = ("smol_a", "smol_b")


def _repo(tmp_path: Path, llm_repo: Path, names: tuple[str, ...] = NAMES) -> Path:
    repo = tmp_path / "repo"
    gguf = (llm_repo / "smollm2" / "1" / "model.gguf").resolve()
    for name in names:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.gguf").symlink_to(gguf)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "llama_cpp"\n'
            'parameters { key: "max_sequences" value { string_value: "2" } }\n'
            'parameters { key: "n_ctx" value { string_value: "1024" } }\n'
        )
    return repo


def _complete(server: ServerProcess, model: str, max_tokens: int = 8) -> tuple[str, dict[str, float]]:
    body = {"model": model, "prompt": "Name a colour:", "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(
        f"http://{server.http_url}/v1/completions", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        doc = json.load(resp)
        timing = {}
        for part in resp.headers["Server-Timing"].split(","):
            name, _, dur = part.strip().partition(";dur=")
            timing[name] = float(dur)
    return doc["choices"][0]["text"], timing


def _status(server: ServerProcess) -> dict[str, str]:
    with urllib.request.urlopen(f"http://{server.http_url}/v1/models", timeout=30) as resp:
        return {m["id"]: m["status"]["value"] for m in json.load(resp)["data"]}


def test_models_load_on_first_request_and_the_least_recently_used_idle_one_unloads(
    tmp_path: Path, llm_repo: Path
) -> None:
    """A cap of 1 MiB: one model at a time fits (a model alone may pass it)."""
    with ServerProcess(_repo(tmp_path, llm_repo), "--llm-memory-mib", "1") as server:
        assert _status(server) == {"smol_a": "unloaded", "smol_b": "unloaded"}
        text, timing = _complete(server, "smol_a")
        assert text and timing["load"] > 0 and timing["ttft"] >= timing["load"], timing
        assert _status(server) == {"smol_a": "loaded", "smol_b": "unloaded"}
        cold = "milliserve_generation_cold_ttft_seconds_count"
        assert metric(server.metrics_url, cold, model="smol_a") == 1
        assert "load" not in _complete(server, "smol_a")[1]  # loaded: a warm answer
        again, timing = _complete(server, "smol_b")  # a is idle: it unloads for b
        assert again == text and timing["load"] > 0
        assert _status(server) == {"smol_a": "unloaded", "smol_b": "loaded"}
        assert "load" in _complete(server, "smol_a")[1]
        assert _status(server) == {"smol_a": "loaded", "smol_b": "unloaded"}
        assert metric(server.metrics_url, "milliserve_model_load_duration_seconds", model="smol_a") > 0


def test_a_model_with_a_request_running_is_never_unloaded(tmp_path: Path, llm_repo: Path) -> None:
    """A long completion on smol_a, then a request for smol_b, which needs a's room: b waits
    until a's answer is whole (not cut off), then loads and answers. Both answer."""
    with ServerProcess(_repo(tmp_path, llm_repo), "--llm-memory-mib", "1") as server:
        _complete(server, "smol_a")  # loaded
        done: dict[str, float] = {}

        def run(model: str, max_tokens: int) -> dict[str, Any]:
            body = {"model": model, "prompt": "A story:", "max_tokens": max_tokens, "ignore_eos": True}
            req = urllib.request.Request(
                f"http://{server.http_url}/v1/completions", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(req, timeout=300) as resp:
                doc: dict[str, Any] = json.load(resp)
            done[model] = time.monotonic()
            return doc

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            long = pool.submit(run, "smol_a", 200)
            while metric(server.metrics_url, "milliserve_generation_running", model="smol_a") < 1:
                time.sleep(0.05)
            short = pool.submit(run, "smol_b", 4)
            a, b = long.result(), short.result()
        assert a["choices"][0]["finish_reason"] == "length" and a["usage"]["completion_tokens"] == 200
        assert b["choices"][0]["finish_reason"] == "length"
        assert done["smol_a"] <= done["smol_b"]
        assert _status(server) == {"smol_a": "unloaded", "smol_b": "loaded"}


def test_concurrent_first_requests_load_a_model_once_and_two_models_answer_together(
    tmp_path: Path, llm_repo: Path
) -> None:
    """A cap both fit under: four requests at once for each cold model; each model loads
    once (one answer of each says so), all eight answer, and both stay loaded."""
    with ServerProcess(_repo(tmp_path, llm_repo), "--llm-memory-mib", "100000") as server:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda m: (m, *_complete(server, m)), [*NAMES] * 4))
        for name in NAMES:
            mine = [timing for m, _, timing in answers if m == name]
            assert len(mine) == 4 and sum("load" in t for t in mine) == 1, mine
            cold = metric(server.metrics_url, "milliserve_generation_cold_ttft_seconds_count", model=name)
            assert cold == 1, answers
        assert _status(server) == {"smol_a": "loaded", "smol_b": "loaded"}


def test_the_least_recently_used_of_the_idle_models_unloads(tmp_path: Path, llm_repo: Path) -> None:
    """Three models, a cap two fit under (from one's size as measured by a first server): a,
    b load; a is used again; c's load unloads b (the least recently used), not a."""
    gguf = (llm_repo / "smollm2" / "1" / "model.gguf").resolve().stat().st_size
    with ServerProcess(_repo(tmp_path / "probe", llm_repo), "--llm-memory-mib", "1") as server:
        _complete(server, "smol_a")
        size = metric(server.metrics_url, "milliserve_generation_resident_bytes", model="smol_a")
    assert size > 0
    # a loaded (size) and one not loaded yet (its file) fit; two loaded and a third's file do not
    cap = int(size + gguf + size / 2) >> 20
    names = ("smol_a", "smol_b", "smol_c")
    with ServerProcess(_repo(tmp_path, llm_repo, names), "--llm-memory-mib", str(cap)) as server:
        _complete(server, "smol_a")
        _complete(server, "smol_b")
        assert _status(server) == {"smol_a": "loaded", "smol_b": "loaded", "smol_c": "unloaded"}
        time.sleep(1.1)  # past the second a model counts as in use after its last request
        _complete(server, "smol_a")
        time.sleep(1.1)
        _complete(server, "smol_c")
        assert _status(server) == {"smol_a": "loaded", "smol_b": "unloaded", "smol_c": "loaded"}


def test_the_repository_api_loads_under_the_cap_too(tmp_path: Path, llm_repo: Path) -> None:
    """Triton's repository API (explicit mode, nothing loaded at start): loading smol_b
    unloads the idle smol_a first, as a request's load would; an unloaded model loads again
    on its next request."""
    repo = _repo(tmp_path, llm_repo)
    with ServerProcess(repo, "--llm-memory-mib", "1", "--model-control-mode", "explicit") as server:

        def control(name: str, action: str) -> None:
            url = f"http://{server.http_url}/v2/repository/models/{name}/{action}"
            with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=300):
                pass

        assert _status(server) == {"smol_a": "unloaded", "smol_b": "unloaded"}
        control("smol_a", "load")
        assert _status(server) == {"smol_a": "loaded", "smol_b": "unloaded"}
        assert metric(server.metrics_url, "milliserve_generation_resident_bytes", model="smol_a") > 0
        time.sleep(1.1)  # past the second a model counts as in use after its load
        control("smol_b", "load")
        assert _status(server) == {"smol_a": "unloaded", "smol_b": "loaded"}
        control("smol_b", "unload")
        assert _status(server) == {"smol_a": "unloaded", "smol_b": "unloaded"}
        assert "load" in _complete(server, "smol_b")[1]
