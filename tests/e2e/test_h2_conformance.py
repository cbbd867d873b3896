"""milliserve's HTTP/2 gRPC listener against a real HTTP/2 client library's edge cases: the
``h2`` package (python-hyper, the HTTP/2 layer of httpx and hypercorn) drives the
connection and checks every frame the server sends against RFC 9113 (an oversized frame,
a flow-control window overrun, a malformed header block or trailer raises in the client).

The edge cases are ones a conforming client may take and the server must follow: a stream
window of a few bytes, request bodies in padded frames of a few bytes, header blocks split
into CONTINUATION frames, the client's HPACK table resized mid-connection and its
SETTINGS changed, PING, PRIORITY, a stream reset half-way, an empty DATA frame that ends a
request, answers larger than a frame and than the connection window, and gRPC errors as
trailers."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e
h2_config = pytest.importorskip("h2.config")
h2_connection = pytest.importorskip("h2.connection")
h2_events = pytest.importorskip("h2.events")
h2_settings = pytest.importorskip("h2.settings")
h2_errors = pytest.importorskip("h2.errors")

INFER = b"/inference.GRPCInferenceService/ModelInfer"
LIVE = b"/inference.GRPCInferenceService/ServerLive"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, write_add_sub: Any) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("h2-conformance")
    write_add_sub(repo)
    with ServerProcess(repo) as srv:
        yield srv
        logs = srv.logs()
    assert "Traceback" not in logs, logs[-3000:]


def grpc_message(x: np.ndarray[Any, Any], model: str = "add_sub") -> bytes:
    msg = pb.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        inp = msg.inputs.add(name=name, datatype="FP32")
        inp.shape.extend(x.shape)
        msg.raw_input_contents.append(x.tobytes())
    body: bytes = msg.SerializeToString()
    return b"\x00" + struct.pack(">L", len(body)) + body


def request_headers(path: bytes = INFER, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra,
    ]


@dataclass
class Answer:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    trailers: dict[bytes, bytes] = field(default_factory=dict)
    ended: bool = False
    reset: int | None = None
    frames: int = 0

    @property
    def grpc_status(self) -> bytes | None:
        return self.trailers.get(b"grpc-status", self.headers.get(b"grpc-status"))

    def outputs(self) -> dict[str, np.ndarray[Any, Any]]:
        assert self.body[:1] == b"\x00", bytes(self.body[:5])
        (size,) = struct.unpack(">L", self.body[1:5])
        assert len(self.body) == 5 + size
        msg = pb.ModelInferResponse.FromString(bytes(self.body[5:]))
        return {
            out.name: np.frombuffer(raw, np.float32).reshape(tuple(out.shape))
            for out, raw in zip(msg.outputs, msg.raw_output_contents, strict=True)
        }


class Client:
    """One h2 client connection over a socket. ``settings`` go with the preface."""

    def __init__(self, srv: ServerProcess, settings: dict[int, int] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=30)
        self.conn = h2_connection.H2Connection(
            h2_config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.answers: dict[int, Answer] = {}
        self.events: list[Any] = []
        self.terminated: Any = None
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, timeout: float = 0.2) -> None:
        """Read what the server sent (for up to ``timeout``) and let h2 check it."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return
        if not data:
            raise ConnectionError("the server closed the connection")
        for ev in self.conn.receive_data(data):
            self.events.append(ev)
            sid = getattr(ev, "stream_id", None)
            answer = self.answers.setdefault(sid, Answer()) if sid else None
            if isinstance(ev, h2_events.ResponseReceived):
                answer.headers = dict(ev.headers)  # type: ignore[union-attr]
            elif isinstance(ev, h2_events.DataReceived):
                answer.body += ev.data  # type: ignore[union-attr]
                answer.frames += 1  # type: ignore[union-attr]
                if ev.flow_controlled_length:  # read: give the window back
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2_events.TrailersReceived):
                answer.trailers = dict(ev.headers)  # type: ignore[union-attr]
            elif isinstance(ev, h2_events.StreamEnded):
                answer.ended = True  # type: ignore[union-attr]
            elif isinstance(ev, h2_events.StreamReset):
                answer.reset = ev.error_code  # type: ignore[union-attr]
            elif isinstance(ev, h2_events.ConnectionTerminated):
                self.terminated = ev
        self.flush()

    def until(self, condition: Any, what: str, timeout_s: float = 30.0) -> None:
        end = time.monotonic() + timeout_s
        while not condition():
            assert self.terminated is None, f"{what}: the server ended the connection: {self.terminated}"
            assert time.monotonic() < end, f"{what} did not happen within {timeout_s:g} s"
            self.pump()

    def send_body(self, sid: int, body: bytes, chunk: int | None = None, pad: int | None = None) -> None:
        """Send ``body`` on ``sid`` and end the stream, within the server's windows and frame size."""
        pos = 0
        while pos < len(body):
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if pad is not None:
                room -= pad + 1
            if chunk is not None:
                room = min(room, chunk)
            if room <= 0:
                self.pump()  # wait for a WINDOW_UPDATE
                continue
            self.conn.send_data(sid, body[pos : pos + room], pad_length=pad)
            pos += room
            self.flush()
        self.conn.end_stream(sid)
        self.flush()

    def call(self, body: bytes, path: bytes = INFER, *extra: tuple[bytes, bytes], **how: Any) -> int:
        sid: int = self.conn.get_next_available_stream_id()
        self.answers[sid] = Answer()
        self.conn.send_headers(sid, request_headers(path, *extra))
        self.flush()
        self.send_body(sid, body, **how)
        return sid

    def answer(self, sid: int) -> Answer:
        self.until(lambda: self.answers[sid].ended or self.answers[sid].reset is not None, f"stream {sid}")
        return self.answers[sid]

    def close(self) -> None:
        try:
            self.conn.close_connection()
            self.flush()
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    c = Client(server)
    yield c
    c.close()


def assert_added(answer: Answer, x: np.ndarray[Any, Any]) -> None:
    assert answer.reset is None and answer.ended, answer
    assert answer.headers[b":status"] == b"200"
    assert answer.headers[b"content-type"].startswith(b"application/grpc")
    assert answer.grpc_status == b"0", answer.trailers
    outputs = answer.outputs()
    np.testing.assert_array_equal(outputs["OUTPUT0"], x + x)
    np.testing.assert_array_equal(outputs["OUTPUT1"], x - x)


def test_interleaved_calls_through_a_window_of_a_few_bytes(server: ServerProcess) -> None:
    # every stream's window is 7 bytes: the server sends each answer 7 bytes at a time, each
    # time the client gives the window back; bodies come in padded 5-byte frames, interleaved
    c = Client(server, {h2_settings.SettingCodes.INITIAL_WINDOW_SIZE: 7})
    try:
        c.until(lambda: any(isinstance(e, h2_events.SettingsAcknowledged) for e in c.events), "SETTINGS ack")
        xs = [np.arange(8, dtype=np.float32).reshape(2, 4) + i for i in range(6)]
        sids = []
        for _ in xs:
            sid = c.conn.get_next_available_stream_id()
            c.answers[sid] = Answer()
            c.conn.send_headers(sid, request_headers())
            sids.append(sid)
        c.flush()
        for sid, x in zip(sids, xs, strict=True):
            c.send_body(sid, grpc_message(x), chunk=5, pad=3)
        for sid, x in zip(sids, xs, strict=True):
            answer = c.answer(sid)
            assert_added(answer, x)
            assert answer.frames >= len(answer.body) // 7
    finally:
        c.close()


def test_an_answer_larger_than_a_frame_and_the_connection_window(client: Client) -> None:
    # 2 x 160 KB out: frames of at most 16 KiB (h2 refuses larger), and the server waits for
    # the client's WINDOW_UPDATEs past the connection's first 64 KiB
    x = np.random.default_rng(0).normal(size=(1, 40_000)).astype(np.float32)
    answer = client.answer(client.call(grpc_message(x)))
    assert_added(answer, x)
    assert answer.frames >= len(answer.body) // 16_384


def test_header_blocks_in_continuation_frames_and_tiny_data_frames(client: Client) -> None:
    # a client may send frames smaller than the server allows: the header block goes in a
    # HEADERS frame and CONTINUATIONs of 40 bytes, the body in 40-byte DATA frames
    # (after the server's SETTINGS, which would set the frame size back)
    client.until(
        lambda: any(isinstance(e, h2_events.RemoteSettingsChanged) for e in client.events),
        "the server's SETTINGS",
    )
    client.conn.max_outbound_frame_size = 40
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    meta = (b"x-request-note", b"n" * 300)  # custom metadata, read as a gRPC header
    assert_added(client.answer(client.call(grpc_message(x), INFER, meta)), x)


def test_the_clients_hpack_table_resized_between_calls(client: Client) -> None:
    # the client's encoder indexes its headers, then shrinks its table to nothing and grows
    # it again: each change is a size update at the start of the next block
    x = np.ones((1, 4), np.float32)
    for size in (4096, 0, 256, 4096):
        client.conn.encoder.header_table_size = size
        meta = (b"x-call", str(size).encode())
        assert_added(client.answer(client.call(grpc_message(x), INFER, meta)), x)


def test_ping_settings_and_priority_mid_connection(client: Client) -> None:
    x = np.full((2, 2), 3.0, np.float32)
    assert_added(client.answer(client.call(grpc_message(x))), x)
    client.conn.ping(b"conform!")
    client.conn.update_settings(
        {h2_settings.SettingCodes.HEADER_TABLE_SIZE: 0, h2_settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000}
    )
    client.flush()
    client.until(
        lambda: any(
            isinstance(e, h2_events.PingAckReceived) and e.ping_data == b"conform!" for e in client.events
        ),
        "the PING's ACK",
    )
    client.until(
        lambda: sum(isinstance(e, h2_events.SettingsAcknowledged) for e in client.events) >= 2,
        "the second SETTINGS' ACK",
    )
    sid = client.conn.get_next_available_stream_id()
    client.answers[sid] = Answer()
    client.conn.send_headers(sid, request_headers(), priority_weight=200, priority_depends_on=0)
    client.conn.prioritize(sid, weight=16)
    client.flush()
    client.send_body(sid, grpc_message(x))
    assert_added(client.answer(sid), x)


def test_a_stream_reset_half_way_leaves_the_connection_serving(client: Client) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    body = grpc_message(x)
    sid = client.conn.get_next_available_stream_id()
    client.conn.send_headers(sid, request_headers())
    client.conn.send_data(sid, body[: len(body) // 2])
    client.conn.reset_stream(sid, h2_errors.ErrorCodes.CANCEL)
    client.flush()
    assert_added(client.answer(client.call(body)), x)
    assert client.terminated is None


def test_an_empty_final_data_frame_ends_the_request(client: Client) -> None:
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    sid = client.conn.get_next_available_stream_id()
    client.answers[sid] = Answer()
    client.conn.send_headers(sid, request_headers())
    client.conn.send_data(sid, grpc_message(x))
    client.conn.send_data(sid, b"", end_stream=True)
    client.flush()
    assert_added(client.answer(sid), x)


def test_grpc_errors_come_as_trailers(client: Client) -> None:
    x = np.ones((1, 4), np.float32)
    unknown_model = client.answer(client.call(grpc_message(x, model="nope")))
    assert unknown_model.reset is None and unknown_model.ended
    assert unknown_model.grpc_status == b"5"  # NOT_FOUND
    live = client.answer(client.call(b"\x00\x00\x00\x00\x00", LIVE))
    assert live.grpc_status == b"0" and live.body[:1] == b"\x00"
    unknown_method = client.answer(client.call(b"", b"/inference.GRPCInferenceService/Nope"))
    assert unknown_method.grpc_status == b"12"  # UNIMPLEMENTED
    assert client.terminated is None
