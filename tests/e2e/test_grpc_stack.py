"""milliserve's own HTTP/2 gRPC listener against real clients (tritonclient, grpcio) and raw
frames: the per-connection bounds of issue 29 (unread answers, connections per peer,
connection age, streams past the limit), compression as Triton takes it (gRPC and HTTP),
the repository index behind the repository API switch, the grpcio fallback stack, and
the SIGTERM drain. The attacks themselves are in test_attacks.py.

Conditions are polled with loose bounds: CI is a loaded 2-core machine.
"""

from __future__ import annotations

import gzip
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from milliserve.drills.h2_attacks import RawH2
from milliserve.drills.tensor_attacks import Target
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.server.h2.frames import DATA, END_HEADERS, END_STREAM, HEADERS, RST_STREAM, frame
from milliserve.testing import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

X = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, write_add_sub: Callable[..., Path]) -> Path:
    repo = tmp_path_factory.mktemp("grpc-stack")
    write_add_sub(repo)
    return repo


LIMITS = {
    "MILLISERVE_GRPC__UNREAD_TIMEOUT_S": "1",
    "MILLISERVE_GRPC__MAX_CONNECTIONS_PER_PEER": "6",
    "MILLISERVE_GRPC__MAX_CONCURRENT_STREAMS": "4",
    # 4 MiB messages: a connection may hold two in flight, so three 3 MB requests at once
    # need one to finish before the third gets its window
    "MILLISERVE_GRPC__MAX_MESSAGE_BYTES": str(4 << 20),
}


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(repo, env={**os.environ, **LIMITS}) as srv:
        yield srv
        logs = srv.logs()
    assert "Traceback" not in logs, logs[-3000:]


def target(srv: ServerProcess) -> Target:
    assert srv.proc is not None
    return Target("127.0.0.1", srv.http_port, srv.grpc_port, srv.proc.pid)


def add_sub_request() -> bytes:
    msg = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        inp = msg.inputs.add(name=name, datatype="FP32")
        inp.shape.extend(X.shape)
        msg.raw_input_contents.append(X.tobytes())
    body: bytes = msg.SerializeToString()
    return b"\x00" + struct.pack(">L", len(body)) + body


def infer_grpc(url: str, **kwargs: object) -> np.ndarray:
    c = tgrpc.InferenceServerClient(url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = tgrpc.InferInput(name, list(X.shape), "FP32")
        inp.set_data_from_numpy(X)
        inputs.append(inp)
    out = c.infer("add_sub", inputs, **kwargs).as_numpy("OUTPUT0")  # type: ignore[arg-type]
    c.close()
    assert out is not None
    return out


def metric(srv: ServerProcess, name: str) -> float:
    text = httpx.get(srv.metrics_url, timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_an_answer_the_client_never_reads_is_cancelled_and_counted(server: ServerProcess) -> None:
    # a zero window: the answer cannot be sent; after unread_timeout_s (1 s) the call is reset
    c = RawH2(target(server), settings={0x4: 0}, ack=True)
    try:
        sid = c.stream()
        c.send(frame(HEADERS, END_HEADERS, sid, c.head()) + frame(DATA, END_STREAM, sid, add_sub_request()))
        assert c.status_of(sid, timeout=30) == "RST_STREAM 8"  # CANCEL
    finally:
        c.close()
    wait_until(
        lambda: metric(server, "milliserve_grpc_unread_cancelled_total") >= 1, timeout_s=30, interval_s=0.1
    )


def test_streams_past_the_concurrency_limit_are_refused(server: ServerProcess) -> None:
    # a client that ignores SETTINGS_MAX_CONCURRENT_STREAMS (4 here): the fifth stream on
    # is refused while the first four are held by a zero window
    c = RawH2(target(server), settings={0x4: 0}, ack=True)
    try:
        out = b""
        for _ in range(6):
            sid = c.stream()
            out += frame(HEADERS, END_HEADERS, sid, c.head()) + frame(
                DATA, END_STREAM, sid, add_sub_request()
            )
        c.send(out)
        refused: set[int] = set()
        end = time.monotonic() + 30
        while len(refused) < 2 and time.monotonic() < end:
            for kind, _, got, payload in c.read(0.2):
                if kind == RST_STREAM and struct.unpack(">L", payload)[0] == 7:
                    refused.add(got)
        assert refused == {9, 11}
    finally:
        c.close()


def test_connections_per_peer_are_capped(server: ServerProcess) -> None:
    conns = [RawH2(target(server), ack=True) for _ in range(6)]
    try:
        wait_until(lambda: metric(server, "milliserve_grpc_connections") >= 6, timeout_s=30, interval_s=0.1)
        extra = RawH2(target(server), ack=True)
        end = time.monotonic() + 30
        while extra.goaway is None and not extra.closed and time.monotonic() < end:
            extra.read(0.2)
        assert extra.ended() == "GOAWAY ENHANCE_YOUR_CALM"
        extra.close()
    finally:
        for c in conns:
            c.close()
    # once they are gone, the same client is served again
    wait_until(lambda: metric(server, "milliserve_grpc_connections") == 0, timeout_s=30, interval_s=0.1)
    np.testing.assert_allclose(infer_grpc(server.grpc_url), X + X)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_grpc_requests_are_taken(server: ServerProcess, algorithm: str) -> None:
    np.testing.assert_allclose(infer_grpc(server.grpc_url, compression_algorithm=algorithm), X + X)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_http_requests_are_taken(server: ServerProcess, algorithm: str) -> None:
    c = thttp.InferenceServerClient(server.http_url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = thttp.InferInput(name, list(X.shape), "FP32")
        inp.set_data_from_numpy(X, binary_data=True)
        inputs.append(inp)
    out = c.infer("add_sub", inputs, request_compression_algorithm=algorithm).as_numpy("OUTPUT0")
    c.close()
    np.testing.assert_allclose(out, X + X)


def test_an_unknown_encoding_is_415_and_a_bomb_is_413(server: ServerProcess) -> None:
    url = f"http://{server.http_url}/v2/models/add_sub/infer"
    doc = b'{"inputs": []}'
    r = httpx.post(url, content=doc, headers={"Content-Encoding": "br"}, timeout=30)
    assert r.status_code == 415 and "gzip" in r.json()["error"]
    bomb = gzip.compress(b" " * (64 << 20))  # 64 MiB of spaces in about 64 KB
    r = httpx.post(url, content=bomb, headers={"Content-Encoding": "gzip"}, timeout=30)
    assert r.status_code == 413
    r = httpx.post(url, content=b"not deflate", headers={"Content-Encoding": "deflate"}, timeout=30)
    assert r.status_code == 400
    r = httpx.post(url, content=zlib.compress(doc), headers={"Content-Encoding": "deflate"}, timeout=30)
    assert r.status_code == 400 and "input" in r.json()["error"]  # decoded, then refused as a request


def test_the_repository_index_follows_the_repository_api(server: ServerProcess, repo: Path) -> None:
    r = httpx.post(f"http://{server.http_url}/v2/repository/index", timeout=30)
    assert r.status_code == 403 and "--model-control-mode explicit" in r.json()["error"]
    with pytest.raises(Exception, match="PERMISSION_DENIED"):
        tgrpc.InferenceServerClient(server.grpc_url).get_model_repository_index()
    with ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "*") as srv:
        index = tgrpc.InferenceServerClient(srv.grpc_url).get_model_repository_index()
        assert [m.name for m in index.models] == ["add_sub"]


def test_unknown_methods_and_http1_on_the_grpc_port(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/inference.GRPCInferenceService/Nope")(b"", timeout=30)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=30) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(30)
        received = b""
        while chunk := s.recv(1024):  # the server's SETTINGS, then the connection is closed
            received += chunk
        assert b"HTTP/1.1" not in received
    np.testing.assert_allclose(infer_grpc(server.grpc_url), X + X)


def test_connection_age_ends_in_goaway_and_clients_carry_on(repo: Path) -> None:
    env = {
        **os.environ,
        "MILLISERVE_GRPC__MAX_CONNECTION_AGE_S": "1",
        "MILLISERVE_GRPC__CONNECTION_AGE_GRACE_S": "1",
    }
    with ServerProcess(repo, env=env) as srv:
        c = RawH2(target(srv), ack=True)
        end = time.monotonic() + 30
        while c.goaway is None and time.monotonic() < end:
            c.read(0.2)
        assert c.ended() == "GOAWAY NO_ERROR"
        c.close()
        client = tgrpc.InferenceServerClient(srv.grpc_url)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            inp = tgrpc.InferInput(name, list(X.shape), "FP32")
            inp.set_data_from_numpy(X)
            inputs.append(inp)
        stop = time.monotonic() + 4  # several connection lifetimes
        calls = 0
        while time.monotonic() < stop:
            client.infer("add_sub", inputs)
            calls += 1
            time.sleep(0.05)
        assert calls > 0


def test_sigterm_drains_grpc_calls_in_flight(repo: Path) -> None:
    srv = ServerProcess(repo).start()
    errors: list[str] = []
    ok = [0]
    stop = threading.Event()

    def caller() -> None:
        with grpc.insecure_channel(srv.grpc_url) as ch:
            call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            while not stop.is_set():
                try:
                    call(add_sub_request()[5:], timeout=30)
                    ok[0] += 1
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:  # refused once stopped: fine
                        errors.append(exc.code().name)
                    return

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: ok[0] > 200, timeout_s=60)
        assert srv.stop() == 0
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        srv.stop()
    assert errors == [], errors  # never CANCELLED


def test_the_grpcio_stack_still_serves(repo: Path) -> None:
    with ServerProcess(repo, env={**os.environ, "MILLISERVE_GRPC__STACK": "grpcio"}) as srv:
        np.testing.assert_allclose(infer_grpc(srv.grpc_url), X + X)
        with grpc.insecure_channel(srv.grpc_url) as ch, pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(b"\xff\xff\xff", timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _message_head(length: int) -> bytes:
    return b"\x00" + struct.pack(">L", length)


def test_dropped_request_bytes_never_shrink_the_connection_window(server: ServerProcess) -> None:
    # 300 requests each announce a 600 KB message and end after 60 KB of it (answered
    # INTERNAL, the bytes dropped), then 50 more are reset midway: 21 MB the server drops,
    # more than the connection's 16 MiB window. The connection must still carry a call.
    c = RawH2(target(server), ack=True)
    try:
        head = c.head()
        partial = _message_head(600_000) + b"\x00" * 60_000
        for i in range(350):
            sid = c.stream()
            end = frame(DATA, END_STREAM, sid, partial) if i < 300 else frame(DATA, 0, sid, partial)
            reset = frame(RST_STREAM, 0, sid, struct.pack(">L", 8)) if i >= 300 else b""
            c.send(frame(HEADERS, END_HEADERS, sid, head) + end + reset)
            c.read()
            if i >= 300:
                time.sleep(0.02)  # well under the reset rate limit: this is not Rapid Reset
        sid = c.stream()
        c.send(frame(HEADERS, END_HEADERS, sid, head) + frame(DATA, END_STREAM, sid, add_sub_request()))
        assert c.status_of(sid) == "OK"
    finally:
        c.close()


def test_interleaved_large_requests_all_finish(server: ServerProcess) -> None:
    # three 3 MB requests sent round-robin in 16 KB frames, within every window the server
    # grants (as grpc-go's writer does): each is answered (INVALID_ARGUMENT: its tensor is
    # junk), none waits forever for window that only another stream's end would free
    c = RawH2(target(server), ack=True)
    size = 3_000_000
    try:
        head = c.head()
        streams = [c.stream() for _ in range(3)]
        body = {sid: _message_head(size) + b"\x0a" * size for sid in streams}
        sent = dict.fromkeys(streams, 0)
        window = dict.fromkeys(streams, 65535)
        conn_window = 65535
        c.send(b"".join(frame(HEADERS, END_HEADERS, sid, head) for sid in streams))
        answered: dict[int, str] = {}
        end = time.monotonic() + 120
        while len(answered) < 3 and time.monotonic() < end:
            progressed = False
            for sid in streams:
                left = len(body[sid]) - sent[sid]
                n = min(16384, left, window[sid], conn_window)
                if left and n > 0:
                    last = n == left
                    c.send(frame(DATA, END_STREAM if last else 0, sid, body[sid][sent[sid] : sent[sid] + n]))
                    sent[sid] += n
                    window[sid] -= n
                    conn_window -= n
                    progressed = True
            for kind, _, got, payload in c.read(0.0 if progressed else 0.2):
                if kind == 8:  # WINDOW_UPDATE
                    inc = struct.unpack(">L", payload)[0]
                    if got == 0:
                        conn_window += inc
                    elif got in window:
                        window[got] += inc
                elif kind == HEADERS and got in streams:
                    headers = dict(c.decoder.decode(payload, 1 << 20))
                    if b"grpc-status" in headers:
                        answered[got] = headers[b"grpc-status"].decode()
                elif kind == RST_STREAM and got in streams:
                    answered[got] = f"RST {struct.unpack('>L', payload)[0]}"
        assert sorted(answered) == streams and set(answered.values()) == {"3"}, answered
    finally:
        c.close()


def test_a_non_ascii_grpc_timeout_is_invalid_argument_and_the_connection_goes_on(
    server: ServerProcess,
) -> None:
    c = RawH2(target(server), ack=True)
    try:
        sid = c.stream()
        head = c.head(extra=((b"grpc-timeout", "²S".encode("latin-1")),))
        c.send(frame(HEADERS, END_HEADERS, sid, head) + frame(DATA, END_STREAM, sid, add_sub_request()))
        assert c.status_of(sid) == "INVALID_ARGUMENT"
        sid = c.stream()
        c.send(frame(HEADERS, END_HEADERS, sid, c.head()) + frame(DATA, END_STREAM, sid, add_sub_request()))
        assert c.status_of(sid) == "OK"
    finally:
        c.close()


def test_too_many_pings_says_so_in_grpcs_words(server: ServerProcess) -> None:
    # grpc clients double their keepalive interval only on GOAWAY debug data "too_many_pings"
    c = RawH2(target(server), ack=True)
    try:
        c.send(frame(8 - 2, 0, 0, b"12345678") * 5)  # PING
        end = time.monotonic() + 30
        while c.goaway is None and not c.closed and time.monotonic() < end:
            c.read(0.2)
        assert c.ended() == "GOAWAY ENHANCE_YOUR_CALM" and c.goaway_debug == b"too_many_pings"
    finally:
        c.close()
