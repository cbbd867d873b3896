"""The generation endpoints against hostile and competing clients, for real: a flood, slow
readers or a disconnect storm from one client never get another refused (fair admission by
peer address), a full queue gives a newcomer the place of the flood's latest request, a
request a free slot takes is never refused by its TTFT estimate, the estimate is calibrated
by the first tokens that came, a stream nobody reads is cancelled, user text never becomes
control tokens, unhonoured fields are refused, and priority orders admission (and, when
configured, preempts and resumes exactly)."""

from __future__ import annotations

import concurrent.futures
import http.client
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

import openai
import pytest

from milliserve.drills.llm_attacks import (
    GoodStreamer,
    LlmTarget,
    _chat,
    disconnect_storm,
    flood_300,
    metric,
    never_reading_streams,
)
from milliserve.testing import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODEL = "smollm2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, llm_repo: Path) -> Iterator[ServerProcess]:
    """The smollm2 example as it is built (``budget { ttft_ms: 1000 }``, 8 sequences), streams
    given up on after 2 s without a write."""
    repo = tmp_path_factory.mktemp("admission")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.gguf").symlink_to((llm_repo / MODEL / "1" / "model.gguf").resolve())
    (repo / MODEL / "config.pbtxt").write_text((llm_repo / MODEL / "config.pbtxt").read_text())
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


@pytest.mark.parametrize("attack", [flood_300, never_reading_streams, disconnect_storm])
def test_one_clients_attack_never_gets_another_address_refused(server: ServerProcess, attack: Any) -> None:
    """One client (127.0.0.1) floods the server with requests, holds streams it never
    reads, or opens streams and leaves at their first chunk (the attack suite's, smaller);
    meanwhile a client on 127.0.0.2 streams a short chat every 0.2 s under the example's
    1 s TTFT budget. Every one of its requests is answered: that client holds more than its
    share of the slots, so the newcomer is next for one (a slot it frees, or one taken from
    it by preemption) and is never refused by estimate, nor by the queue."""
    t = _target(server)
    quick = LlmTarget(t.host, t.port, t.metrics_url, t.pid, quick=True)
    statuses: Counter[str] = Counter()
    good = GoodStreamer(t)
    during: list[float] = []

    def attacks() -> None:  # again while the good client has had fewer than 3 answers in it
        for _ in range(6):
            statuses.update(attack(quick))
            if len(during) + len(good.ttfts) >= 3:
                return

    thread = threading.Thread(target=attacks)
    good.thread.start()
    wait_until(lambda: len(good.ttfts) >= 1, 120, "a good answer before the attack")
    good.window()
    ended = metric(t.metrics_url, "milliserve_generation_finished_total")
    thread.start()
    try:
        thread.join(timeout=900)
        good.stop.set()
        good.thread.join(timeout=120)
        # the good client's answers while the attack ran (and the one in flight as it ended)
        during, failures = good.window()
        assert not failures, (failures, good.take_examples(), statuses)
        assert during, statuses
        # the attack did load the server: more of its requests taken (and ended: answered,
        # cancelled, given up on) than there are slots, beside the good client's
        wait_until(
            lambda: metric(t.metrics_url, "milliserve_generation_finished_total") - ended - len(during) >= 8,
            120,
            f"the attack's requests ended (it got {statuses})",
        )
    finally:
        good.stop.set()
        wait_until(lambda: metric(t.metrics_url, "milliserve_generation_running") == 0, 120, "idle")


def test_a_stream_nobody_reads_is_cancelled_and_frees_its_slot(server: ServerProcess) -> None:
    t = _target(server)
    wait_until(lambda: metric(t.metrics_url, "milliserve_generation_running") == 0, 120, "the engine idle")
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


def _post_from(server: ServerProcess, body: dict[str, Any], source: str) -> tuple[int, Any]:
    """POST a completion from ``source`` (another loopback address: another client)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=300, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_request_a_free_slot_takes_is_never_refused_by_its_estimate(tmp_path: Path, llm_repo: Path) -> None:
    """A budget of 1 ms, which every estimate is over: the openai SDK's four concurrent
    streams on four slots, and requests beside a running one, are all served (a free slot
    takes each); only a fifth while four run, which would wait for a slot, is refused."""
    repo = _repo(tmp_path, llm_repo, max_sequences="4")
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + "budget { ttft_ms: 1 }\n")
    with ServerProcess(repo) as server:
        client = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0)

        def stream(i: int) -> str:
            chunks = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Count to {i + 5}."}],
                max_tokens=24,
                stream=True,
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        for _ in range(2):  # twice: the second time the estimate has learned the machine
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                assert all(pool.map(stream, range(4)))
        assert metric(server.metrics_url, "milliserve_generation_refused_budget_total") == 0

        long = {"model": MODEL, "prompt": "A long story:", "max_tokens": 300, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            held = [pool.submit(_post, server, long, "/v1/completions") for _ in range(4)]
            wait_until(
                lambda: metric(server.metrics_url, "milliserve_generation_running") == 4, 120, "four running"
            )
            status, got = _post(server, {**long, "max_tokens": 4}, "/v1/completions")
            assert [f.result()[0] for f in held] == [200] * 4
    assert status == 429, got
    assert "every sequence slot is taken" in got["error"]["message"], got


def _server_timing(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def test_the_ttft_estimate_is_calibrated_by_the_first_tokens_that_came(
    tmp_path: Path, llm_repo: Path
) -> None:
    """Two slots; rounds of five requests 0.25 s apart, so that the first finds the engine
    idle, the second a free slot beside it, and the others wait for a slot. After a warm-up
    of two rounds, the first tokens of the next four rounds come within 2x of what
    admission estimated, either way: the median, and at least four in five of them (on a
    machine shared with other work, a stall of seconds now and then is no estimate's to
    foresee). Each answer's Server-Timing carries both; the metric of their ratio counts
    the same."""
    repo = _repo(tmp_path, llm_repo, max_sequences="2")
    with ServerProcess(repo) as server:

        def one(i: int) -> dict[str, float]:
            body = {
                "model": MODEL,
                "prompt": f"Question {i}: name a colour and a fruit.",
                "max_tokens": 40,
                "ignore_eos": True,
                "temperature": 0,
            }
            req = urllib.request.Request(
                f"http://{server.http_url}/v1/completions", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(req, timeout=300) as resp:
                return _server_timing(resp.headers["Server-Timing"])

        def round_(k: int) -> list[dict[str, float]]:
            with concurrent.futures.ThreadPoolExecutor(5) as pool:
                sent = []
                for i in range(5):
                    sent.append(pool.submit(one, 10 * k + i))
                    time.sleep(0.25)
                return [f.result() for f in sent]

        for k in range(2):
            round_(k)
        counted = metric(server.metrics_url, "milliserve_generation_ttft_estimate_ratio_count")
        within = _ratio_bucket(server, "2.0") - _ratio_bucket(server, "0.5")
        timings = [t for k in range(2, 6) for t in round_(k)]
        ratios = sorted(t["ttft"] / t["ttft_est"] for t in timings)
        good = [r for r in ratios if 0.5 < r <= 2.0]
        assert 0.5 < ratios[len(ratios) // 2] <= 2.0, ratios
        assert len(good) >= 0.8 * len(ratios), ratios
        assert metric(server.metrics_url, "milliserve_generation_ttft_estimate_ratio_count") - counted == 20
        in_metric = _ratio_bucket(server, "2.0") - _ratio_bucket(server, "0.5") - within
        assert abs(in_metric - len(good)) <= 1, (in_metric, ratios)  # the ms in the header are rounded
        for case in ("idle", "slot", "queued"):
            assert metric(server.metrics_url, "milliserve_generation_ttft_calibration", case=case) > 0


def _ratio_bucket(server: ServerProcess, le: str) -> float:
    return metric(server.metrics_url, "milliserve_generation_ttft_estimate_ratio_bucket", le=le)


def _stream_from(server: ServerProcess, body: dict[str, Any], source: str) -> tuple[int, bytes]:
    """A streamed completion from ``source``: its status and its whole body."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=300, source_address=(source, 0))
    try:
        doc = json.dumps({**body, "stream": True})
        conn.request("POST", "/v1/completions", doc, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_full_queue_gives_a_newcomer_the_place_of_the_floods_latest(tmp_path: Path, llm_repo: Path) -> None:
    """One slot, a queue of 8. 127.0.0.1 holds the slot and fills seven places (its share;
    the last a stream); 127.0.0.2 takes the eighth, then sends two more while the queue is
    full: each takes the place of 127.0.0.1's latest waiting request, which ends with a 429
    saying so (the stream's in its body: its status line was out). All three of
    127.0.0.2's requests are answered."""
    repo = _repo(tmp_path, llm_repo, max_sequences="1", max_queue="8", preemption="off")
    with ServerProcess(repo) as server:
        body = {"model": MODEL, "prompt": "Count slowly:", "ignore_eos": True, "temperature": 0}
        short = {**body, "max_tokens": 8}
        url = server.metrics_url
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            first = pool.submit(_post_from, server, {**body, "max_tokens": 400}, "127.0.0.1")
            wait_until(lambda: metric(url, "milliserve_generation_running") == 1, 120, "the slot taken")
            flood = [pool.submit(_post_from, server, short, "127.0.0.1") for _ in range(6)]
            wait_until(lambda: metric(url, "milliserve_generation_waiting") == 6, 120, "six waiting")
            streamed = pool.submit(_stream_from, server, short, "127.0.0.1")
            wait_until(lambda: metric(url, "milliserve_generation_waiting") == 7, 120, "seven waiting")
            newcomer = [pool.submit(_post_from, server, short, "127.0.0.2")]
            wait_until(lambda: metric(url, "milliserve_generation_waiting") == 8, 120, "the queue full")
            for _ in range(2):
                newcomer.append(pool.submit(_post_from, server, short, "127.0.0.2"))
                n = len(newcomer) - 1
                wait_until(
                    lambda n=n: metric(url, "milliserve_generation_finished_total", reason="refused") == n,
                    120,
                    f"{n} evicted",
                )
            assert [f.result()[0] for f in newcomer] == [200] * 3
            flooded = [f.result() for f in flood]
            stream_status, stream_body = streamed.result()
            assert first.result()[0] == 200
    assert sorted(status for status, _ in flooded) == [200] * 5 + [429], flooded
    evicted = [doc["error"]["message"] for status, doc in flooded if status == 429]
    assert all("gave its place to another client's" in m for m in evicted), evicted
    assert stream_status == 200, stream_body
    assert b'"code":"rate_limit_exceeded"' in stream_body.replace(b" ", b""), stream_body
    assert b"gave its place to another client's" in stream_body
