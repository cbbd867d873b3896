"""Hostile and unlucky inputs replayed against a running server, and what they cost others.

Each attack sends crafted requests (HTTP or gRPC) to the example repository's models
(``fraud_mlp``, ``fraud``, ``minilm``, ``sentiment``) while well-behaved HTTP and gRPC
clients keep calling ``fraud_mlp`` from a process of their own (``drills/bystanders.py``).
For each attack the result records the statuses the attacker got, its slowest answer, the
server's RSS growth (read from /proc), and the waits the well-behaved clients saw
meanwhile (worst and p99): a server that pays for an attack with another client's latency
has not contained it. What an attack sends is built before its window opens
(``Attack.prepare``): the attacker's own work is not the server's.

Used by ``tests/e2e/test_attacks.py`` (assertions) and ``benchmarks/attack_suite.py``
(the figures in docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import http.client
import re
import socket
import struct
import time

import grpc
import numpy as np
import orjson

from milliserve.config.settings import HttpSettings
from milliserve.drills.attack_runner import Attack, AttackResult, Target, attack, run_attacks
from milliserve.drills.process_probe import cpu_seconds, rss_bytes
from milliserve.protocol.proto import oip_pb2 as pb

__all__ = [
    "ATTACKS",
    "BASELINE",
    "JSON_LIMIT",
    "Attack",
    "AttackResult",
    "Target",
    "attack",
    "cpu_seconds",
    "rss_bytes",
    "run_attacks",
]

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


# ---- the wire ----
# The pipelines have a 50 ms budget: an attack is about input, not about that deadline,
# which a loaded machine can miss (a 429) whatever the input
_DEADLINE = {"x-request-deadline-ms": "60000"}


def _http(
    t: Target, path: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 120
) -> str:
    conn = http.client.HTTPConnection(t.host, t.http_port, timeout=timeout)
    try:
        conn.request("POST", path, body, {**_DEADLINE, **(headers or {"Content-Type": "application/json"})})
        return str(conn.getresponse().status)
    finally:
        conn.close()


def _get(host: str, port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def _binary(t: Target, model: str, inputs: list[dict[str, object]], payload: bytes) -> str:
    header = orjson.dumps({"inputs": inputs})
    return _http(
        t,
        f"/v2/models/{model}/infer",
        header + payload,
        {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
    )


def _json(t: Target, model: str, doc: object) -> str:
    return _http(t, f"/v2/models/{model}/infer", orjson.dumps(doc))


def _grpc(t: Target, msg: pb.ModelInferRequest, timeout: float = 120) -> str:
    with grpc.insecure_channel(
        f"{t.host}:{t.grpc_port}", options=[("grpc.max_send_message_length", 64 << 20)]
    ) as ch:
        call = ch.unary_unary(
            _INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            call(msg, timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[no-any-return]
        return "OK"


# ---- the attacks ----
def bytes_shape_overflow_http(t: Target) -> str:
    """A BYTES tensor declaring 2**31 elements with 5 bytes of payload (121 bytes in all)."""
    return _binary(
        t,
        "sentiment",
        [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 2**31], "parameters": {"binary_data_size": 5}}],
        struct.pack("<I", 1) + b"x",
    )


def bytes_shape_overflow_grpc(t: Target) -> str:
    msg = pb.ModelInferRequest(model_name="sentiment")
    inp = msg.inputs.add(name="TEXT", datatype="BYTES")
    inp.shape.extend([1, 2**31])
    msg.raw_input_contents.append(struct.pack("<I", 1) + b"x")
    return _grpc(t, msg)


def shape_product_overflow_grpc(t: Target) -> str:
    """A shape whose element count does not fit in 64 bits, with typed contents."""
    msg = pb.ModelInferRequest(model_name="sentiment")
    inp = msg.inputs.add(name="TEXT", datatype="BYTES")
    inp.shape.extend([2**62, 2**62])
    inp.contents.bytes_contents.append(b"x")
    return _grpc(t, msg)


@functools.cache
def _large_rejected() -> pb.ModelInferRequest:
    data = np.zeros((4096 * 16, 64), np.float32).tobytes()[:16_500_000]
    msg = pb.ModelInferRequest(model_name="fraud_mlp")
    inp = msg.inputs.add(name="features", datatype="FP64")
    inp.shape.extend([len(data) // (64 * 8), 64])
    msg.raw_input_contents.append(data[: (len(data) // 512) * 512])
    return msg


def large_rejected_grpc(t: Target) -> str:
    """16.5 MB requests the server must refuse (wrong datatype): their memory must not stay."""
    return _grpc(t, _large_rejected())


def bool_dim_http(t: Target) -> str:
    doc = {"inputs": [{"name": "features", "shape": [True, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    return _json(t, "fraud_mlp", doc)


# the server's default JSON body limit: the attacks below go just under it and past it
JSON_LIMIT: int = HttpSettings.model_fields["max_json_bytes"].default


@functools.cache
def _json_numbers(size: int) -> bytes:
    """A fraud_mlp request of about ``size`` bytes of JSON numbers."""
    rows = (size - 100) // (64 * 15 + 2)
    data = b"[" + b",".join([b"0.123456789012"] * (rows * 64)) + b"]"
    head = b'{"inputs":[{"name":"features","shape":[%d,64],"datatype":"FP32","data":' % rows
    return head + data + b"}]}"


def json_30mb_http(t: Target) -> str:
    """A 30 MB JSON body: over the JSON limit, refused before it is read."""
    return _http(t, "/v2/models/fraud_mlp/infer", _json_numbers(30_000_000))


def json_numbers_at_limit_http(t: Target) -> str:
    """JSON numbers just under the JSON body limit: decoded (off the event loop, in a few
    milliseconds), then refused (more rows than fraud_mlp takes in a request)."""
    return _http(t, "/v2/models/fraud_mlp/infer", _json_numbers(JSON_LIMIT - 4096))


@functools.cache
def _json_strings(size: int) -> bytes:
    rows = (size - 100) // 14
    data = b"[" + b",".join([b'"a few words"'] * rows) + b"]"
    head = b'{"inputs":[{"name":"TEXT","shape":[%d,1],"datatype":"BYTES","data":' % rows
    return head + data + b"}]}"


def json_strings_12mb_http(t: Target) -> str:
    """12 MB of JSON strings (a BYTES tensor of 800k texts): over the JSON limit."""
    return _http(t, "/v2/models/sentiment/infer", _json_strings(12_000_000))


def json_strings_at_limit_http(t: Target) -> str:
    """JSON strings just under the JSON body limit (a BYTES tensor of 150k texts): decoded
    off the event loop, then refused (more rows than the pipeline batches)."""
    return _http(t, "/v2/models/sentiment/infer", _json_strings(JSON_LIMIT - 4096))


def deep_json_http(t: Target) -> str:
    body = b'{"inputs":[{"name":"features","shape":[1,64],"datatype":"FP32","data":' + b"[" * 5000
    return _http(t, "/v2/models/fraud_mlp/infer", body + b"]" * 5000 + b"}]}")


@functools.cache
def _text_30mb() -> bytes:
    return b"good " * 6_000_000


def text_30mb_http(t: Target) -> str:
    """One 30 MB text for the tokenizer: cut to the configured size, never tokenized whole."""
    text = _text_30mb()
    return _binary(
        t,
        "sentiment",
        [
            {
                "name": "TEXT",
                "datatype": "BYTES",
                "shape": [1, 1],
                "parameters": {"binary_data_size": len(text) + 4},
            }
        ],
        struct.pack("<I", len(text)) + text,
    )


def invalid_utf8_entity_http(t: Target) -> str:
    user = b"\xff\xfe\xfd"
    tx = np.zeros((1, 4), np.float32)
    return _binary(
        t,
        "fraud",
        [
            {"name": "user_id", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": 7}},
            {
                "name": "transaction",
                "datatype": "FP32",
                "shape": [1, 4],
                "parameters": {"binary_data_size": 16},
            },
        ],
        struct.pack("<I", len(user)) + user + tx.tobytes(),
    )


def _minilm_doc(rows: int, ids: int, mask: int) -> dict[str, object]:
    """A MiniLM request of ``rows`` rows: ``ids`` token ids and ``mask`` mask entries each."""
    return {
        "inputs": [
            {"name": name, "shape": [rows, n], "datatype": "INT64", "data": [value] * (rows * n)}
            for name, n, value in (("input_ids", ids, 101), ("attention_mask", mask, 1))
        ]
    }


def _ids(t: Target, ids: int, mask: int) -> str:
    return _json(t, "minilm", _minilm_doc(1, ids, mask))


def sequence_over_512_http(t: Target) -> str:
    return _ids(t, 600, 600)


def ids_mask_lengths_differ_http(t: Target) -> str:
    return _ids(t, 10, 12)


def binary_flag_string_http(t: Target) -> str:
    doc = {
        "inputs": [{"name": "features", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}],
        "parameters": {"binary_data_output": "maybe"},
    }
    return _json(t, "fraud_mlp", doc)


def header_1mib_http(t: Target) -> str:
    with socket.create_connection((t.host, t.http_port), timeout=60) as s:
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        reply = s.recv(64)
    return reply.split(b" ")[1].decode() if reply.startswith(b"HTTP/1.1 ") else "closed"


def oversized_body_http(t: Target) -> str:
    with socket.create_connection((t.host, t.http_port), timeout=60) as s:
        s.sendall(
            b"POST /v2/models/fraud_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 400000000\r\n\r\n{"
        )
        reply = s.recv(64)
    return reply.split(b" ")[1].decode() if reply.startswith(b"HTTP/1.1 ") else "closed"


STORM_TOKENS = 256


def largest_minilm_batch(t: Target) -> None:
    """Legitimate MiniLM requests as large as the storm's batches can be (the model's
    ``max_batch_size`` rows of STORM_TOKENS), answered before the storm: ONNX Runtime's arena
    grows to the working set of the largest batch it has run (about 300 MiB for 32 x 256
    tokens) and keeps it, whoever sent that batch. Measured from here, the storm's RSS
    growth is what it costs beyond what any client of the model may cost. With several
    workers, sent (each on a new connection) until every worker's metrics show it ran one."""
    rows = max(1, int(orjson.loads(_get(t.host, t.http_port, "/v2/models/minilm/config"))["max_batch_size"]))
    doc = _minilm_doc(rows, STORM_TOKENS, STORM_TOKENS)
    for _ in range(32):
        status = _json(t, "minilm", doc)
        if status != "200":
            raise RuntimeError(f"the largest MiniLM batch ({rows} x {STORM_TOKENS}) got {status}")
        counts = _minilm_counts(t)
        if min(counts, default=rows) >= rows:
            return
    raise RuntimeError(f"32 largest MiniLM batches did not reach every worker: {counts}")


def _minilm_counts(t: Target) -> list[float]:
    """MiniLM's inference count in each worker (none known without the metrics port)."""
    if not t.metrics_port:
        return []
    text = _get(t.host, t.metrics_port, "/metrics").decode()
    line = r'^milliserve_inference_count_total\{(?:[^}]*,)?model="minilm"[^}]*\} (\S+)'
    found = re.findall(line, text, re.M)
    return [float(v) for v in found]


def disconnect_storm_http(t: Target) -> str:
    """200 clients send a MiniLM request of 256 tokens each and leave without reading: the
    server must not compute what nobody will read (the good clients wait behind it if it does)."""
    body = orjson.dumps(_minilm_doc(1, STORM_TOKENS, STORM_TOKENS))
    head = (
        f"POST /v2/models/minilm/infer HTTP/1.1\r\nHost: {t.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    clients = []
    try:
        for _ in range(200):
            sock = socket.create_connection((t.host, t.http_port), timeout=30)
            sock.sendall(head + body)
            clients.append(sock)
        # the server reads the bodies and queues the requests (a request whose body it had
        # not read yet was always dropped: its body read ends in a disconnect)
        time.sleep(1.0)
    finally:
        for sock in clients:
            sock.close()
    return "left"


def stream_with_a_bad_message_grpc(t: Target) -> str:
    """good, bad (shape overflow), good on one ModelStreamInfer: three answers, in order of
    completion, the bad one an error_message; 'OK' when the stream ended on its own."""

    def requests() -> object:
        x = np.zeros((1, 64), np.float32).tobytes()
        for i, bad in enumerate((False, True, False)):
            msg = pb.ModelInferRequest(model_name="fraud_mlp" if not bad else "sentiment", id=str(i))
            inp = msg.inputs.add(
                name="features" if not bad else "TEXT", datatype="FP32" if not bad else "BYTES"
            )
            inp.shape.extend([1, 64] if not bad else [1, 2**31])
            msg.raw_input_contents.append(x if not bad else b"\x01\x00\x00\x00x")
            yield msg

    with grpc.insecure_channel(f"{t.host}:{t.grpc_port}") as ch:
        call = ch.stream_stream(
            _STREAM,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        try:
            answers = list(call(requests(), timeout=60))
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[no-any-return]
    errors = sorted(a.infer_response.id for a in answers if a.error_message)
    return "OK" if len(answers) == 3 and errors == ["1"] else f"answers={len(answers)} errors={errors}"


def nothing(t: Target) -> str:
    """No attack: the good clients alone for 3 s (the machine's own noise)."""
    time.sleep(3.0)
    return "idle"


_a = attack

BASELINE = _a("none (the good clients alone for 3 s)", nothing, {"idle"})

ATTACKS: tuple[Attack, ...] = (
    _a("BYTES shape [1, 2**31], 5-byte payload (HTTP binary)", bytes_shape_overflow_http, {"400"}, 6),
    _a(
        "BYTES shape [1, 2**31], 5-byte payload (gRPC raw)",
        bytes_shape_overflow_grpc,
        {"INVALID_ARGUMENT"},
        6,
    ),
    _a("shape [2**62, 2**62] (gRPC contents)", shape_product_overflow_grpc, {"INVALID_ARGUMENT"}),
    _a(
        "16.5 MB rejected requests x40 (gRPC)",
        large_rejected_grpc,
        {"INVALID_ARGUMENT"},
        40,
        lambda _: _large_rejected(),
    ),
    _a("bool dim [true, 64] (HTTP JSON)", bool_dim_http, {"400"}),
    _a("30 MB JSON body", json_30mb_http, {"413"}, prepare=lambda _: _json_numbers(30_000_000)),
    _a(
        "JSON numbers just under the JSON limit",
        json_numbers_at_limit_http,
        {"400"},
        prepare=lambda _: _json_numbers(JSON_LIMIT - 4096),
    ),
    _a(
        "12 MB of JSON strings (BYTES)",
        json_strings_12mb_http,
        {"413"},
        prepare=lambda _: _json_strings(12_000_000),
    ),
    _a(
        "JSON strings just under the JSON limit (BYTES)",
        json_strings_at_limit_http,
        {"400"},
        prepare=lambda _: _json_strings(JSON_LIMIT - 4096),
    ),
    _a("JSON nested 5000 deep", deep_json_http, {"400"}),
    _a("30 MB text to the tokenizer", text_30mb_http, {"200", "400"}, prepare=lambda _: _text_30mb()),
    _a("invalid UTF-8 entity id (fraud pipeline)", invalid_utf8_entity_http, {"400"}),
    _a("MiniLM sequence of 600 tokens", sequence_over_512_http, {"400"}),
    _a("MiniLM ids and mask of different lengths", ids_mask_lengths_differ_http, {"400"}),
    _a("binary_data_output: 'maybe'", binary_flag_string_http, {"400"}),
    _a("1 MiB header", header_1mib_http, {"431"}),
    _a("Content-Length 400 MB", oversized_body_http, {"413"}),
    _a("stream: good, shape overflow, good (gRPC)", stream_with_a_bad_message_grpc, {"OK"}),
    _a(
        "200 MiniLM requests whose clients leave at once",
        disconnect_storm_http,
        {"left"},
        prepare=largest_minilm_batch,
    ),
)
