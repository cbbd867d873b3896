"""The streaming client against servers that misbehave on purpose: it reads awkward
streams, and every failure comes back as a status with its message, never raised.

The servers here are the fake OpenAI server (milliserve.bench.fake_openai) and two raw
asyncio servers written below; they stand in for a real one to test the client only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from milliserve.bench.fake_openai import FakeLlm, serve_fake_openai
from milliserve.bench.llm_client import (
    CONNECT_ERROR,
    STREAM_CUT,
    STREAM_ERROR,
    TIMEOUT,
    LlmClient,
    StreamResult,
)
from milliserve.bench.llm_prompts import load_prompts
from milliserve.bench.llm_workload import build_llm_workload
from milliserve.bench.openai_target import parse_api_target
from milliserve.testing import free_port, wait_until_async

PROMPTS = load_prompts("builtin:chat")[:1]


async def _listening(port: int) -> bool:
    try:
        _, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    w.close()
    return True


def run_against(
    serve: Callable[[int], Awaitable[None]] | None,
    requests: int = 1,
    timeout_s: float = 30.0,
    max_tokens: int = 8,
) -> tuple[list[StreamResult], int]:
    """Serve on a free port (None: nothing listens), send ``requests`` one after another;
    the results and the client's idle connections at the end."""

    async def main() -> tuple[list[StreamResult], int]:
        port = free_port()
        server = asyncio.create_task(serve(port)) if serve else None
        if server:
            await wait_until_async(lambda: _listening(port), 10, "the test server listening")
        w = build_llm_workload(
            parse_api_target(f"http://127.0.0.1:{port}"),
            "m",
            PROMPTS,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
        )
        client = LlmClient(w.target, w.timeout_s)
        try:
            return [await client.request(w.requests[0]) for _ in range(requests)], len(client.idle)
        finally:
            client.close()
            if server:
                await asyncio.sleep(0.1)  # the servers read the client's close and close their side
                server.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await server

    return asyncio.run(main())


def fake(**kw: Any) -> Callable[[int], Awaitable[None]]:
    return lambda port: serve_fake_openai(port, FakeLlm(**kw))


def test_an_awkward_stream_is_read_whole_over_one_kept_alive_connection() -> None:
    behaviour = {"tokens": 8, "crlf": True, "split": True, "comments": True, "server_timing": True}
    results, idle = run_against(fake(**behaviour), requests=2)
    for r in results:
        assert r.status == 200, r.message
        assert len(r.tally.chunk_times) == 8 and r.tally.output_tokens == 8 and r.tally.done
        assert (
            r.tally.chunk_times == sorted(r.tally.chunk_times) and r.sent <= r.tally.chunk_times[0] <= r.done
        )
        assert r.tally.timings["server-timing.queue"] == 0.25
    assert idle == 1  # the second request reused the first one's connection


def test_max_tokens_and_bundled_chunks() -> None:
    (r,), _ = run_against(fake(tokens=50, tokens_per_chunk=3), max_tokens=10)
    assert r.status == 200 and r.tally.output_tokens == 10 and len(r.tally.chunk_times) == 4


@pytest.mark.parametrize(
    ("behaviour", "status", "message"),
    [
        ({"error_every": 1}, 500, "fake overload"),
        ({"stream_error_every": 1}, STREAM_ERROR, "fake failure mid-stream"),
        ({"cut_every": 1}, STREAM_CUT, "stream cut after 4 content chunks"),
    ],
)
def test_failures_come_back_as_statuses(behaviour: dict[str, int], status: int, message: str) -> None:
    results, _ = run_against(fake(tokens=8, **behaviour), requests=2)  # and the client goes on
    for r in results:
        assert r.status == status and r.message.startswith(message), (r.status, r.message)


def test_refused_connections_and_timeouts() -> None:
    (refused,), _ = run_against(None)
    assert refused.status == CONNECT_ERROR and "ConnectionRefusedError" in refused.message
    (slow,), idle = run_against(fake(ttft_ms=5000), timeout_s=0.3)
    assert slow.status == TIMEOUT and "no end of stream after 0.3 s" in slow.message and idle == 0


SSE = b'data: {"choices": [{"index": 0, "text": "hi"}]}\n\ndata: [DONE]\n\n'


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)


def test_a_kept_alive_connection_the_server_dropped_is_retried_once() -> None:
    # the race of an idle timeout: the server closes a connection as the client reuses it
    async def serve(port: int) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            chunk = b"%x\r\n%s\r\n" % (len(SSE), SSE)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk + b"0\r\n\r\n")
            await reader.read(1 << 16)  # the next request on this connection is not answered
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    results, _ = run_against(serve, requests=3)
    assert [r.status for r in results] == [200, 200, 200] and all(r.tally.output_tokens == 1 for r in results)


def test_a_body_delimited_by_the_close_is_complete() -> None:
    async def serve(port: int) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + SSE
            )
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    results, idle = run_against(serve, requests=2)
    assert [r.status for r in results] == [200, 200] and idle == 0
    assert results[0].tally.done and results[0].tally.output_tokens == 1
