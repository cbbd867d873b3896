"""Connection limits against real servers, with sockets opened by hand (issue 10, items
4, 5 and 12): a header-size cap, head/body/keep-alive deadlines, a connection cap, gRPC
metadata limits, and a clear error for a port that is already taken.

Bounds are loose and conditions are polled: the CI machine is a loaded 2-core box.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.testing import ServerProcess, free_port

pytestmark = pytest.mark.e2e

LIMITS_ENV = {
    "MILLISERVE_HTTP__HEADER_TIMEOUT_S": "1",
    "MILLISERVE_HTTP__BODY_TIMEOUT_S": "1",
    "MILLISERVE_HTTP__KEEP_ALIVE_S": "2",
}
READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, write_add_sub: Callable[..., Path]) -> Path:
    repo = tmp_path_factory.mktemp("limits")
    write_add_sub(repo)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    """Short head, body and keep-alive deadlines (1 s, 1 s, 2 s)."""
    with ServerProcess(repo, env={**os.environ, **LIMITS_ENV}) as srv:
        yield srv


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def read_until_closed(sock: socket.socket, timeout_s: float = 30.0) -> tuple[bytes, bool]:
    """What the server sent, and whether it closed the connection within ``timeout_s``."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return received, False
    except ConnectionResetError:
        pass
    return received, True


def ready_status(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=30).status_code


def test_a_1_mib_header_is_refused_431_while_others_are_served(server: ServerProcess) -> None:
    sock = connect(server.http_port)
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"

    def send() -> None:
        with contextlib.suppress(OSError):  # the server need not read it all before it closes
            sock.sendall(head)

    sender = threading.Thread(target=send)
    start = time.monotonic()
    sender.start()
    assert ready_status(server.http_port) == 200  # another client meanwhile
    answer, closed = read_until_closed(sock)
    elapsed = time.monotonic() - start
    sender.join()
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"16384 bytes (max_header_bytes)" in answer
    assert closed and elapsed < 10, elapsed
    assert ready_status(server.http_port) == 200


def test_half_a_header_is_answered_408_after_header_timeout(server: ServerProcess) -> None:
    with connect(server.http_port) as sock:
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: test\r\nContent-Le")
        start = time.monotonic()
        answer, closed = read_until_closed(sock)
        elapsed = time.monotonic() - start
    assert closed, "the server kept a half-sent header open"
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"header_timeout_s" in answer
    assert 0.5 < elapsed < 15, elapsed


def test_a_silent_connection_is_closed_after_header_timeout(server: ServerProcess) -> None:
    with connect(server.http_port) as sock:
        start = time.monotonic()
        answer, closed = read_until_closed(sock)
        elapsed = time.monotonic() - start
    assert closed and answer == b"", answer[:200]
    assert 0.5 < elapsed < 15, elapsed


def test_a_partial_body_is_answered_408_after_body_timeout(server: ServerProcess) -> None:
    with connect(server.http_port) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n"
            b'{"inputs": ['
        )
        start = time.monotonic()
        answer, closed = read_until_closed(sock)
        elapsed = time.monotonic() - start
    assert closed, "the server kept a partial body open"
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"body_timeout_s" in answer
    assert 0.5 < elapsed < 15, elapsed
    assert ready_status(server.http_port) == 200


def test_an_early_answer_on_a_closing_connection_reaches_its_client(server: ServerProcess) -> None:
    """A body that declares 40 MB (over the request limit), with ``Connection: close``: its
    413 is answered before the body is read, and the server reads and drops what the client
    still sends before it closes. Closing at once reset the connection while the client was
    sending, and the client never read its 413."""
    with connect(server.http_port) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: 40000000\r\n\r\n"
        )
        sock.sendall(b"[" * (3 << 20))  # the client goes on sending before it reads
        sock.shutdown(socket.SHUT_WR)
        answer, closed = read_until_closed(sock)
    assert closed
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_keep_alive_is_announced_and_idle_connections_are_closed(server: ServerProcess) -> None:
    with connect(server.http_port) as sock:
        sock.sendall(READY)
        start = time.monotonic()
        answer, closed = read_until_closed(sock)
        elapsed = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\nkeep-alive: timeout=2\r\n" in answer, answer
    assert closed and 1.0 < elapsed < 15, elapsed
    close = httpx.get(
        f"http://127.0.0.1:{server.http_port}/v2/health/ready", headers={"Connection": "close"}, timeout=30
    )
    assert "keep-alive" not in close.headers


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts /proc/PID/fd")
def test_connections_over_max_connections_are_refused(repo: Path) -> None:
    env = {**os.environ, "MILLISERVE_HTTP__MAX_CONNECTIONS": "20"}
    with ServerProcess(repo, env=env) as srv:
        assert srv.proc is not None
        before = open_fds(srv.proc.pid)
        socks = [connect(srv.http_port) for _ in range(50)]
        try:
            for sock in socks:
                with contextlib.suppress(OSError):  # a refused one may be closed already
                    sock.sendall(READY)
            served = refused = 0
            for sock in socks:
                sock.settimeout(30)
                try:
                    first = sock.recv(65536)
                except ConnectionResetError:
                    first = b""
                if first.startswith(b"HTTP/1.1 200 "):
                    served += 1
                elif first == b"" or first.startswith(b"HTTP/1.1 503 "):
                    refused += 1
            assert 1 <= served <= 20 and served + refused == 50, (served, refused)
            # every connection has had its answer, so the server has seen them all: it holds
            # the served ones open (keep-alive), never more than its limit
            assert open_fds(srv.proc.pid) <= before + 25
        finally:
            for sock in socks:
                sock.close()
        deadline = time.monotonic() + 30
        while ready_status(srv.http_port) != 200:  # the closes reach the server
            assert time.monotonic() < deadline
            time.sleep(0.1)


def grpc_live(port: int, metadata: list[tuple[str, str]]) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        return bool(live(pb.ServerLiveRequest(), metadata=metadata, timeout=30).live)


def test_grpc_metadata_over_the_limit_is_refused(server: ServerProcess) -> None:
    # under max_metadata_bytes (16 KiB): always accepted (grpc's own soft limit refuses at random)
    for _ in range(20):
        assert grpc_live(server.grpc_port, [("x-pad", "a" * 12 * 1024)])
    with pytest.raises(grpc.RpcError) as err:
        grpc_live(server.grpc_port, [("x-big", "a" * (1 << 20))])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_live(server.grpc_port, [])


@pytest.mark.parametrize(("listener", "flag"), [("HTTP", "http"), ("gRPC", "grpc"), ("metrics", "metrics")])
def test_a_second_server_on_a_port_in_use_exits_1_naming_it(
    server: ServerProcess, repo: Path, listener: str, flag: str
) -> None:
    taken = getattr(server, f"{flag}_port")
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port(), flag: taken}
    cmd = [sys.executable, "-m", "milliserve", "serve", str(repo)]
    for name, port in ports.items():
        cmd += [f"--{name}-port", str(port)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, output
    assert output == (
        f"milliserve: error: the {listener} port {taken} on 127.0.0.1 is already in use "
        f"(another server?); choose another with --{flag}-port"
    )
    assert ready_status(server.http_port) == 200  # the first server is untouched
