"""Generative serving for real: the smollm2 example (SmolLM2-135M Q4_1) on the llama_cpp
backend, called with the openai SDK, tritonclient's gRPC streaming client, and raw HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from milliserve.testing import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODEL = "smollm2"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Summarize: The quick brown fox jumps over the lazy dog. The dog sleeps. The fox runs away. Summary:",
]


@pytest.fixture(scope="module")
def client(llm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{llm_server.http_url}/v1", api_key="unused", max_retries=0)


def _post(server: ServerProcess, path: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_openai_sdk_chat_and_completions(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 16
    assert chat.choices[0].finish_reason in ("stop", "length")

    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]

    comp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    assert comp.usage is not None and comp.usage.completion_tokens == 10  # no EOS this early
    assert comp.choices[0].finish_reason == "length"
    streamed = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == comp.choices[0].text


def test_greedy_output_is_llama_cpps_own(llm_server: ServerProcess, llm_repo: Path) -> None:
    """Served alone, a greedy completion is token for token what llama.cpp's own generation
    (llama-cpp-python's Llama, flash attention on as llama.cpp's default context has it)
    gives, with prompt-lookup speculation on and off."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(llm_repo / MODEL / "1" / "model.gguf"),
        n_threads=1,
        n_ctx=2048,
        flash_attn=True,
        verbose=False,
    )
    for prompt in PROMPTS:
        ref = llm.create_completion(prompt, max_tokens=40, temperature=0.0, repeat_penalty=1.0)
        for spec in (True, False):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0, "speculative": spec}
            status, got = _post(llm_server, "/v1/completions", body)
            assert status == 200, got
            assert got["choices"][0]["text"] == ref["choices"][0]["text"], (prompt, spec)  # type: ignore[index]
    del llm


def _no_budget_repo(tmp_path: Path, llm_repo: Path) -> Path:
    """The smollm2 example without its TTFT budget (which refuses work on a loaded machine)."""
    repo = tmp_path / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "llama_cpp"\n')
    return repo


@pytest.fixture(scope="module")
def free_server(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[ServerProcess]:
    """The smollm2 example without a TTFT budget, for tests of what several requests decoded
    together give: on a loaded machine the example's 1 s budget refuses some of 8 requests
    sent at once (its estimate honestly over budget), and those would not be batched."""
    with ServerProcess(_no_budget_repo(tmp_path_factory.mktemp("free"), llm_repo)) as server:
        yield server


def test_eight_streams_interleave(free_server: ServerProcess) -> None:
    """Continuous batching: 8 streams sent together all decode together. The model has no
    TTFT budget here, so a loaded machine cannot refuse (and so delay) any of them; each
    generates 48 tokens, long after all 8 have had their first."""

    async def main(url: str) -> tuple[list[float], list[float]]:
        ac = openai.AsyncOpenAI(base_url=f"http://{url}/v1", api_key="x", max_retries=0, timeout=300)
        firsts: list[float] = []
        ends: list[float] = []

        async def one(i: int) -> None:
            stream = await ac.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Count from {i} to {i + 40}."}],
                max_tokens=48,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            seen = False
            async for chunk in stream:
                if not seen and chunk.choices and chunk.choices[0].delta.content:
                    firsts.append(time.monotonic())
                    seen = True
            ends.append(time.monotonic())

        await asyncio.gather(*(one(i) for i in range(8)))
        await ac.close()
        return firsts, ends

    firsts, ends = asyncio.run(main(free_server.http_url))
    assert len(firsts) == 8 and len(ends) == 8
    # every stream had its first token before any stream ended: all 8 were decoding at once
    assert max(firsts) < min(ends), "some streams decoded alone"


def test_speculation_drafts_are_made_accepted_and_change_nothing(tmp_path: Path, llm_repo: Path) -> None:
    """On a prompt that quotes its answer, prompt lookup drafts tokens and the model accepts
    them; the text is exactly what the same request gives without speculation. A question
    asked again drafts from the engine's earlier answer, and the answer is the same.

    What the engine drafts is gated by time: only while a step stays within its ITL target
    (80% of budget.itl_ms; on a machine loaded past CI's a one-token step alone took 90 ms),
    and only as many tokens as the step costs it has measured say pay (under two CPU burners
    those swung until the repeated question drafted nothing). The model here has an ITL
    target no step misses and drafts 4 tokens wherever a lookup finds them (draft_tokens =
    draft_min = 4), so that what is tested is the drafting, not those gates."""
    repo = _no_budget_repo(tmp_path, llm_repo)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(
        config.read_text()
        + "budget { itl_ms: 60000 }\n"
        + 'parameters { key: "draft_tokens" value { string_value: "4" } }\n'
        + 'parameters { key: "draft_min" value { string_value: "4" } }\n'
    )
    with ServerProcess(repo) as server:
        _speculation_is_exact(server)


def _speculation_is_exact(llm_server: ServerProcess) -> None:
    text = (
        "The council voted to build new bicycle lanes on Oak Avenue next year. The bicycle lanes "
        "cost four hundred thousand dollars and took six months to build."
    )
    prompt = f"Repeat this text word for word.\n\nText: {text}\n\nRepeated text: The council"
    drafted0 = _metric(llm_server, "milliserve_generation_draft_tokens_total")
    accepted0 = _metric(llm_server, "milliserve_generation_accepted_tokens_total")
    outs = {}
    for spec in (True, False):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 32, "temperature": 0, "speculative": spec}
        status, got = _post(llm_server, "/v1/completions", body)
        assert status == 200, got
        outs[spec] = got
    details = outs[True]["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0, details
    assert outs[False]["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0
    assert outs[True]["choices"][0]["text"] == outs[False]["choices"][0]["text"]
    assert _metric(llm_server, "milliserve_generation_draft_tokens_total") > drafted0
    assert _metric(llm_server, "milliserve_generation_accepted_tokens_total") > accepted0
    # an answer that quotes nothing of its prompt, asked again: drafted from the earlier answer
    recalled0 = _metric(llm_server, "milliserve_generation_recalled_accepted_tokens_total")
    question = "Name three colours and say in one sentence each why people like them."
    for spec in (False, True):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 48,
            "temperature": 0,
            "speculative": spec,
        }
        status, got = _post(llm_server, "/v1/chat/completions", body)
        assert status == 200, got
        outs[spec] = got
    assert outs[True]["usage"]["completion_tokens"] == 48
    assert outs[True]["choices"][0]["message"] == outs[False]["choices"][0]["message"]
    assert outs[True]["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    assert _metric(llm_server, "milliserve_generation_recalled_accepted_tokens_total") > recalled0


def _stream_then_disconnect(server: ServerProcess, path: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port))) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        s.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
        got = b""
        while b"data:" not in got:  # the stream has begun
            more = s.recv(65536)
            assert more, f"the server closed the connection: {got[:300]!r}"
            got += more


def test_disconnect_frees_the_sequence(llm_server: ServerProcess) -> None:
    aborted = _metric(llm_server, "milliserve_generation_finished_total", reason="abort")
    body = {"model": MODEL, "prompt": "Write a long essay about the sea.", "max_tokens": 1500}
    _stream_then_disconnect(llm_server, "/v1/completions", {**body, "stream": True, "ignore_eos": True})
    wait_until(
        lambda: _metric(llm_server, "milliserve_generation_finished_total", reason="abort") == aborted + 1,
        what="the disconnected stream counted as aborted",
    )
    wait_until(lambda: _metric(llm_server, "milliserve_generation_kv_tokens") == 0, what="KV use back to 0")
    assert _metric(llm_server, "milliserve_generation_running") == 0

    # a non-streamed request whose client leaves is cancelled too
    req = urllib.request.Request(
        f"http://{llm_server.http_url}/v1/completions",
        data=json.dumps({**body, "ignore_eos": True}).encode(),
        method="POST",
    )
    with pytest.raises(TimeoutError):
        urllib.request.urlopen(req, timeout=0.5)
    wait_until(
        lambda: _metric(llm_server, "milliserve_generation_finished_total", reason="abort") == aborted + 2,
        what="the abandoned request counted as aborted",
    )
    wait_until(lambda: _metric(llm_server, "milliserve_generation_kv_tokens") == 0, what="KV use back to 0")


def test_a_stream_whose_client_stops_reading_is_dropped_and_frees_its_slot(
    tmp_path: Path, llm_repo: Path
) -> None:
    """A client that stays connected but stops reading: once the stream's buffers are full,
    a chunk waits at most ``stream_write_timeout_s``, then the sequence is cancelled and the
    connection closed. (A chunk written while nothing is queued skips that timer: this is
    what must still hold once the writes back up.)"""
    env = {
        **os.environ,
        "MILLISERVE_HTTP__STREAM_WRITE_TIMEOUT_S": "1",
        "MILLISERVE_HTTP__STREAM_BUFFER_BYTES": "4096",
    }
    with ServerProcess(_no_budget_repo(tmp_path, llm_repo), env=env) as server:
        aborted = _metric(server, "milliserve_generation_finished_total", reason="abort")
        body = {"model": MODEL, "prompt": "Write a long essay about the sea.", "max_tokens": 1500}
        data = json.dumps({**body, "stream": True, "ignore_eos": True}).encode()
        host, port = server.http_url.split(":")
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
            s.connect((host, int(port)))
            head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            s.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
            got = b""
            while b"data:" not in got:  # the stream has begun; from here on nothing is read
                more = s.recv(4096)
                assert more, f"the server closed the connection: {got[:300]!r}"
                got += more
            finished = lambda: _metric(server, "milliserve_generation_finished_total", reason="abort")  # noqa: E731
            wait_until(lambda: finished() == aborted + 1, what="the unread stream ended")
            kv = lambda: _metric(server, "milliserve_generation_kv_tokens")  # noqa: E731
            wait_until(lambda: kv() == 0, what="KV use back to 0")
            assert _metric(server, "milliserve_generation_running") == 0
            s.settimeout(60)
            with contextlib.suppress(ConnectionResetError):  # what it had sent, then the close
                while s.recv(65536):
                    pass


def test_stop_strings_max_tokens_and_seeds(client: openai.OpenAI) -> None:
    prompt = "List the numbers: 1, 2, 3, 4, 5, 6, 7, 8,"
    stopped = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[" 12"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert " 12" not in stopped.choices[0].text
    assert stopped.choices[0].text.rstrip(",").endswith("11")
    # a stop string split across streamed chunks is still caught and never shown
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[", 1"], stream=True
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert ", 1" not in text

    short = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
    assert short.usage is not None and short.usage.completion_tokens == 3
    assert short.choices[0].finish_reason == "length"

    def sample(seed: int) -> str:
        out = client.completions.create(
            model=MODEL, prompt="A short poem:", max_tokens=24, temperature=1.0, top_p=0.95, seed=seed
        )
        return out.choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1  # the seed matters


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "messages",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 9}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "word " * 5000}, 400, "messages"),
        ("/v1/completions", {"model": "no-such-model", "prompt": "x"}, 404, None),
        ("/v1/completions", {"prompt": "x"}, 400, "model"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 3}, 400, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a"] * 9}, 400, "stop"),
    ],
)
def test_bad_requests_get_openai_errors(
    llm_server: ServerProcess, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    got_status, got = _post(llm_server, path, body)
    assert got_status == status, got
    assert set(got["error"]) >= {"message", "type", "param", "code"}
    assert got["error"]["param"] == param
    assert got["error"]["message"]


def test_malformed_json_and_sdk_errors(llm_server: ServerProcess, client: openai.OpenAI) -> None:
    status, got = _post(llm_server, "/v1/chat/completions", None, raw=b'{"model": "smollm2", "messa')
    assert status == 400 and got["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0
        )
    # a tensor model's route is not a generation route, and the reverse
    status, got = _post(llm_server, f"/v2/models/{MODEL}/generate", {"parameters": {}})
    assert status == 400 and "text_input" in got["error"]


def test_triton_generate_extension(llm_server: ServerProcess) -> None:
    status, got = _post(
        llm_server,
        f"/v2/models/{MODEL}/generate",
        {"text_input": "The capital of France is", "parameters": {"max_tokens": 8, "temperature": 0}},
    )
    assert status == 200, got
    assert got["model_name"] == MODEL and got["text_output"] and got["finish_reason"] == "length"

    body = json.dumps({"text_input": "The capital of France is", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://{llm_server.http_url}/v2/models/{MODEL}/generate_stream", data=body, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["content-type"] == "text/event-stream"
        events = [
            json.loads(line[5:]) for line in resp.read().decode().splitlines() if line.startswith("data:")
        ]
    assert len(events) >= 2
    assert "".join(e["text_output"] for e in events) == got["text_output"]
    assert events[-1]["finish_reason"] == "length" and "ttft;dur=" in events[-1]["server_timing"]


def test_tritonclient_grpc_streaming(llm_server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(llm_server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))

    def request(text: str, params: dict[str, Any], rid: str) -> None:
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
        sp = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        sp.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=object))
        c.async_stream_infer(MODEL, [inp, sp], request_id=rid)

    request("The capital of France is", {"max_tokens": 10, "temperature": 0}, "a")
    parts: list[str] = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None, error
        parts.append(result.as_numpy("text_output")[0].decode())
        assert result.get_response().id == "a"
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    c.stop_stream()
    assert len(parts) > 2  # one response per token chunk
    _, got = _post(
        llm_server,
        f"/v2/models/{MODEL}/generate",
        {"text_input": "The capital of France is", "max_tokens": 10, "temperature": 0},
    )
    assert "".join(parts) == got["text_output"]

    # a cancelled stream frees its sequence
    aborted = _metric(llm_server, "milliserve_generation_finished_total", reason="abort")
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    request("Write a long essay about the sea.", {"max_tokens": 1500, "ignore_eos": True}, "b")
    results.get(timeout=60)
    c.stop_stream(cancel_requests=True)
    wait_until(
        lambda: _metric(llm_server, "milliserve_generation_finished_total", reason="abort") == aborted + 1,
        what="the cancelled gRPC stream counted as aborted",
    )
    wait_until(lambda: _metric(llm_server, "milliserve_generation_kv_tokens") == 0, what="KV use back to 0")
    c.close()


def test_prefix_cache_reuses_a_shared_system_prompt(client: openai.OpenAI) -> None:
    system = "You are a terse assistant for a bicycle shop. Answer in one short sentence. " * 2
    usages = []
    for q in ("Do you sell helmets?", "Are you open on Sunday?"):
        out = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
            max_tokens=4,
            temperature=0,
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        usages.append(out.usage.prompt_tokens_details.cached_tokens)
    assert usages[1] is not None and usages[1] >= 30  # the second reused the system prompt's KV


def test_kept_and_saved_kv_give_the_same_answer(tmp_path: Path, llm_repo: Path) -> None:
    """A chat's next turn starts from the KV its slot kept; a prompt whose slot was taken by
    others comes back from host memory (prompt_cache_mib); both answer exactly as a cold
    prefill does. Two slots, so that four other prompts overwrite them."""
    repo = tmp_path / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "llama_cpp"\n'
        'parameters { key: "max_sequences" value { string_value: "2" } }\n'
        'parameters { key: "prefix_cache_slots" value { string_value: "0" } }\n'
    )
    question = "List four parts of a bicycle and say in one sentence what each part does."
    with ServerProcess(repo) as server:

        def chat(messages: list[dict[str, str]]) -> tuple[str, int]:
            status, got = _post(
                server,
                "/v1/chat/completions",
                {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0},
            )
            assert status == 200, got
            return got["choices"][0]["message"]["content"], got["usage"]["prompt_tokens_details"][
                "cached_tokens"
            ]

        first, cached = chat([{"role": "user", "content": question}])
        assert cached < 30  # cold: at most the chat template's default system prompt was there
        # the next turn begins with the whole first exchange, kept in the slot
        turn = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "Now the same for a car."},
        ]
        _, cached = chat(turn)
        assert cached >= 40, cached
        for i in range(4):  # other prompts take both slots
            chat([{"role": "user", "content": f"Count from {i} to {i + 5} in words, please."}])
        hits = _metric(server, "milliserve_generation_host_cache_hits_total")
        again, cached = chat([{"role": "user", "content": question}])
        assert again == first  # restored KV answers exactly as the cold prefill did
        assert cached >= 30, cached
        assert _metric(server, "milliserve_generation_host_cache_hits_total") == hits + 1
        assert _metric(server, "milliserve_generation_host_cache_bytes") > 0


def test_metrics_and_statistics(llm_server: ServerProcess) -> None:
    assert _metric(llm_server, "milliserve_generation_ttft_seconds_count") > 0
    assert _metric(llm_server, "milliserve_generation_itl_seconds_count") > 0
    assert _metric(llm_server, "milliserve_generation_output_tokens_total") > 0
    assert _metric(llm_server, "milliserve_generation_kv_capacity_tokens") > 0
    with urllib.request.urlopen(f"http://{llm_server.http_url}/v2/models/{MODEL}/stats", timeout=10) as resp:
        stats = json.load(resp)["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] > 0


def test_budget_refuses_what_cannot_meet_ttft(tmp_path: Path, llm_repo: Path) -> None:
    repo = tmp_path / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "llama_cpp"\nbudget {{ ttft_ms: 50 }}\n'
        'parameters { key: "max_sequences" value { string_value: "2" } }\n'
    )
    with ServerProcess(repo) as server:
        long_prompt = "Tell me about the history of the bicycle in great detail. " * 20
        body = {"model": MODEL, "prompt": long_prompt, "max_tokens": 200, "ignore_eos": True}

        async def main() -> list[tuple[int, Any]]:
            loop = asyncio.get_running_loop()
            first = loop.run_in_executor(None, _post, server, "/v1/completions", body)
            wait_until(
                lambda: _metric(server, "milliserve_generation_running") >= 1, what="a running request"
            )
            later = [loop.run_in_executor(None, _post, server, "/v1/completions", body) for _ in range(3)]
            return list(await asyncio.gather(first, *later))

        answers = asyncio.run(main())
    assert answers[0][0] == 200  # an idle engine always admits
    refused = [doc for status, doc in answers[1:] if status == 429]
    assert refused, answers
    assert "ttft_ms" in refused[0]["error"]["message"] and " ms " in refused[0]["error"]["message"]
    assert refused[0]["error"]["type"] == "rate_limit_error"


def test_batched_greedy_output_is_the_lone_output(free_server: ServerProcess) -> None:
    """Eight greedy completions decoded together give what each gives alone (one KV buffer
    per sequence; llama.cpp's unified buffer was seen to drift after 0-24 tokens). On a
    server without a TTFT budget, so that none of the eight is refused on a loaded machine."""
    prompts = [*PROMPTS, "Once upon a time,", "The three laws of robotics are", "Water boils at", "In 1969,"]

    def body(p: str) -> dict[str, Any]:
        return {"model": MODEL, "prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True}

    alone = [_post(free_server, "/v1/completions", body(p))[1]["choices"][0]["text"] for p in prompts]

    async def together() -> list[str]:
        loop = asyncio.get_running_loop()
        got = await asyncio.gather(
            *(loop.run_in_executor(None, _post, free_server, "/v1/completions", body(p)) for p in prompts)
        )
        return [doc["choices"][0]["text"] for _, doc in got]

    assert asyncio.run(together()) == alone
