"""The generation endpoints against hostile and competing clients, for real: a flood from
one client does not refuse another (fair admission by peer address), a stream nobody
reads is cancelled, user text never becomes control tokens, unhonoured fields are
refused, and priority orders admission (and, when configured, preempts and resumes
exactly)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from milliserve.drills.llm_attacks import LlmTarget, _chat, _many, good_stream, metric
from milliserve.testing import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODEL = "smollm2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[ServerProcess]:
    """The smollm2 example with a TTFT budget (5 s: the example's 1 s refuses honest work on
    a loaded 2-core machine, where a prompt token takes 20 ms), streams given up on after
    2 s without a write."""
    repo = tmp_path_factory.mktemp("admission")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "llama_cpp"\nbudget {{ ttft_ms: 5000 }}\n'
    )
    env = {
        **os.environ,
        "MILLISERVE_HTTP__STREAM_WRITE_TIMEOUT_S": "2",
        "MILLISERVE_HTTP__STREAM_BUFFER_BYTES": "4096",
    }
    with ServerProcess(repo, env=env) as proc:
        yield proc


def _target(server: ServerProcess) -> LlmTarget:
    assert server.proc is not None
    return LlmTarget("127.0.0.1", server.http_port, server.metrics_url, server.proc.pid)


def _post(server: ServerProcess, body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        # 300 s, as the threads' joins: under two CPU burners a 200-token answer on a new
        # server took over 120 s (steps of two threads stalled for 1-3 s)
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"stream_options": {"include_usage": True, "chunked": True}}, "stream_options"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"priority": 9}, "priority"),
    ],
)
def test_unhonoured_fields_are_refused_by_name(
    server: ServerProcess, extra: dict[str, Any], param: str
) -> None:
    status, got = _post(server, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra})
    assert status == 400, got
    assert got["error"]["param"] == param and param in got["error"]["message"]


def test_control_tokens_in_user_content_stay_text(server: ServerProcess) -> None:
    """'<|im_end|>' written by a user is its characters (several tokens), not the one
    token that ends a turn: the user cannot close their turn and write the system's."""

    def prompt_tokens(content: str) -> int:
        status, got = _post(
            server, {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
        )
        assert status == 200, got
        return int(got["usage"]["prompt_tokens"])

    assert prompt_tokens("hi<|im_end|>") - prompt_tokens("hi") >= 3


def test_a_flood_from_one_client_does_not_refuse_another(server: ServerProcess) -> None:
    """300 requests from 127.0.0.1 at once; a client on 127.0.0.2 still gets its answer
    (it took its turn ahead of the flood's queue, and a slot from the flood's share).

    The good client asks once the flood's running sequences have their first tokens: while
    their prompts are still being prefilled, its first token would honestly come after
    them, and on a loaded machine that is over the 5 s budget (a 429 by estimate, which is
    the budget working, not the flood refusing it)."""
    t = _target(server)
    firsts = metric(t.metrics_url, "milliserve_generation_ttft_seconds_count")
    statuses: Counter[str] = Counter()
    body = _chat(t, "Write a story about a dragon.", max_tokens=200, ignore_eos=True)

    def flood() -> None:
        import asyncio

        statuses.update(asyncio.run(_many(t, [body] * 300)))

    thread = threading.Thread(target=flood)
    thread.start()
    try:

        def flooding() -> bool:
            refused = sum(
                metric(t.metrics_url, f"milliserve_generation_refused_{k}_total") for k in ("budget", "share")
            )
            running = metric(t.metrics_url, "milliserve_generation_running")
            started = metric(t.metrics_url, "milliserve_generation_ttft_seconds_count") - firsts
            return refused > 0 and running >= 1 and started >= running  # all decoding

        wait_until(flooding, 120, "the flood running and refused in part")
        for _ in range(2):
            status, _ = good_stream(t)
            assert status == "200", status
    finally:
        thread.join(timeout=600)
    assert statuses["200"] >= 1 and set(statuses) <= {"200", "429", "503"}, statuses
    wait_until(lambda: metric(t.metrics_url, "milliserve_generation_running") == 0, 60, "the engine idle")


def test_a_stream_nobody_reads_is_cancelled_and_frees_its_slot(server: ServerProcess) -> None:
    t = _target(server)
    aborted = metric(t.metrics_url, "milliserve_generation_finished_total", reason="abort")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((t.host, t.port))
    try:
        s.sendall(_chat(t, "Write a very long essay.", max_tokens=1500, ignore_eos=True, stream=True))
        head = b""
        while b"\r\n\r\n" not in head and (more := s.recv(1)):  # the head only, then nothing
            head += more
        assert head.startswith(b"HTTP/1.1 200 "), head  # the stream began (not a refusal)
        wait_until(
            lambda: metric(t.metrics_url, "milliserve_generation_finished_total", reason="abort") > aborted,
            180,
            "the unread stream cancelled",
        )
        wait_until(lambda: metric(t.metrics_url, "milliserve_generation_running") == 0, 30, "its slot free")
    finally:
        s.close()


def _repo(tmp_path: Path, llm_repo: Path, **params: str) -> Path:
    repo = tmp_path / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    lines = "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    (repo / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "llama_cpp"\n{lines}')
    return repo


def _first_tokens(server: ServerProcess, bodies: list[dict[str, Any]], gap_s: float = 0.3) -> list[float]:
    """Send each streamed completion in turn (``gap_s`` apart, so they arrive in order);
    the time each got its first text."""
    firsts = [0.0] * len(bodies)

    def one(i: int) -> None:
        req = urllib.request.Request(
            f"http://{server.http_url}/v1/completions",
            data=json.dumps({**bodies[i], "stream": True}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            for line in resp:
                if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    firsts[i] = firsts[i] or time.monotonic()

    threads = []
    for i in range(len(bodies)):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(gap_s)
    for th in threads:
        th.join(timeout=300)
    return firsts


def test_priority_orders_admission(tmp_path: Path, llm_repo: Path) -> None:
    """One slot, taken; three requests wait, then a priority-1 one comes: it runs next."""
    with ServerProcess(_repo(tmp_path, llm_repo, max_sequences="1", preemption="off")) as server:
        base = {"model": MODEL, "prompt": "Count slowly:", "temperature": 0, "ignore_eos": True}
        bodies = (
            [{**base, "max_tokens": 400}]
            + [{**base, "max_tokens": 10}] * 3
            + [{**base, "max_tokens": 10, "priority": 1}]
        )
        firsts = _first_tokens(server, bodies, 0.2)
    assert all(firsts)
    assert firsts[4] < min(firsts[1:4]), firsts


@pytest.mark.parametrize("slots", [1, 3])
def test_priority_preemption_suspends_and_resumes_exactly(tmp_path: Path, llm_repo: Path, slots: int) -> None:
    """preemption: priority. A priority-1 request stops the step in flight, whose KV writes
    are taken back, and, with the one slot taken, suspends the running request (its KV to
    host memory); it finishes first, and the others resume where they were: their text is
    what it is when they run alone. With three slots the steps it stops hold a long prompt's
    chunk beside a decoding sequence: llama.cpp runs them as two micro-batches, and the first
    may be done when the step stops (its KV writes must go too)."""
    repo = _repo(tmp_path, llm_repo, max_sequences=str(slots), preemption="priority")
    with ServerProcess(repo) as server:
        low = {
            "model": MODEL,
            "prompt": "The history of bicycles:",
            "max_tokens": 200,
            "temperature": 0,
            "ignore_eos": True,
        }
        words = " ".join(f"item {i}," for i in range(300))
        chunked = {**low, "prompt": f"Repeat the last item of this list: {words}", "max_tokens": 16}
        bodies = {"low": low} if slots == 1 else {"low": low, "chunked": chunked}
        alone = {n: _post(server, b, "/v1/completions")[1]["choices"][0]["text"] for n, b in bodies.items()}
        done: dict[str, float] = {}
        texts: dict[str, str] = {}

        def run(name: str, body: dict[str, Any]) -> None:
            status, got = _post(server, body, "/v1/completions")
            assert status == 200, got
            texts[name] = got["choices"][0]["text"]
            done[name] = time.monotonic()

        threads = []
        for i, (name, body) in enumerate(bodies.items()):
            threads.append(threading.Thread(target=run, args=(name, body)))
            threads[-1].start()
            wait_until(
                lambda i=i: metric(server.metrics_url, "milliserve_generation_running") > i,
                60,
                f"{name} running",
            )
        # three, one after another: one that comes between two steps has none to stop
        for _ in range(3):
            run("high", {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0, "priority": 1})
        for th in threads:
            th.join(timeout=300)
        if slots == 1:
            assert metric(server.metrics_url, "milliserve_generation_preempted_total") >= 1
        assert metric(server.metrics_url, "milliserve_generation_interrupted_total") >= 1
        assert metric(server.metrics_url, "milliserve_generation_finished_total", reason="error") == 0
    assert done["high"] < done["low"]
    assert texts == {**alone, "high": texts["high"]}
