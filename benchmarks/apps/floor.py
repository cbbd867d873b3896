"""The floor: what a Python HTTP/1.1 front end can reach on this machine. A bare protocol on
uvloop + httptools that answers each OIP request by running the model through ONNX Runtime
right in ``on_message_complete``: no tasks, no routing, no batching, no metrics, no limits.

    python benchmarks/apps/floor.py MODEL.onnx PORT [--fixed]

``--fixed`` answers a fixed body without running the model (the protocol alone). Understands
OIP JSON and the binary tensor extension for one FP32 input; anything else is a 400. A GET
answers the model's metadata and config (what perf_analyzer asks before it measures), built
once from the ONNX file. Not a server: a measuring stick, kept beside milliserve in the same
run (``benchmarks/server_overhead.py``).
"""

from __future__ import annotations

import asyncio
import socket
import sys

import httptools
import numpy as np
import onnxruntime as ort
import orjson
import uvloop

_OK_JSON = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
_OK_BIN = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
    b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n"
)
_BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TYPES = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32"}


def described(session: ort.InferenceSession, name: str, max_batch: int) -> dict[bytes, bytes]:
    """What a GET answers, by path: metadata, config, readiness (perf_analyzer's questions)."""

    def tensors(items: list[ort.NodeArg], config: bool) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for t in items:
            kind = _TYPES[t.type]
            dims = [d if isinstance(d, int) else -1 for d in t.shape]
            if config:
                out.append({"name": t.name, "data_type": f"TYPE_{kind}", "dims": dims[1:]})
            else:
                out.append({"name": t.name, "datatype": kind, "shape": dims})
        return out

    ins, outs = session.get_inputs(), session.get_outputs()
    meta = {"name": name, "versions": ["1"], "platform": "onnxruntime_onnx"}
    meta |= {"inputs": tensors(ins, False), "outputs": tensors(outs, False)}
    config = {"name": name, "platform": "onnxruntime_onnx", "max_batch_size": max_batch}
    config |= {"input": tensors(ins, True), "output": tensors(outs, True)}
    base = f"/v2/models/{name}".encode()
    return {
        base: orjson.dumps(meta),
        base + b"/config": orjson.dumps(config),
        base + b"/ready": b"{}",
        b"/v2": orjson.dumps({"name": "floor", "version": "0", "extensions": []}),
        b"/v2/health/ready": b"{}",
        b"/v2/health/live": b"{}",
    }


class Floor(asyncio.Protocol):
    def __init__(self, session: ort.InferenceSession | None, output: str, gets: dict[bytes, bytes]) -> None:
        self.session = session
        self.output = output
        self.gets = gets
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.header_length = -1
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(_BAD)
            self.transport.close()

    def on_message_begin(self) -> None:
        self.body = []
        self.header_length = -1
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self.header_length = int(value)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.parser.get_method() == b"GET":
            answer = self.gets.get(self.url.split(b"?")[0])
            if answer is None:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            else:
                self.transport.write(_OK_JSON % len(answer) + answer)
            return
        body = b"".join(self.body)
        if self.session is None:
            out = b'{"model_name":"fraud_mlp","outputs":[]}'
            self.transport.write(_OK_JSON % len(out) + out)
            return
        n = self.header_length
        doc = orjson.loads(body if n < 0 else body[:n])
        t = doc["inputs"][0]
        shape = t["shape"]
        if n < 0:
            x = np.asarray(t["data"], dtype=np.float32).reshape(shape)
        else:
            x = np.frombuffer(body, np.float32, offset=n).reshape(shape)
        y = self.session.run(None, {t["name"]: x})[0]
        if n < 0:
            out = orjson.dumps(
                {
                    "model_name": "fraud_mlp",
                    "outputs": [
                        {
                            "name": self.output,
                            "datatype": "FP32",
                            "shape": list(y.shape),
                            "data": y.reshape(-1),
                        }
                    ],
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            self.transport.write(_OK_JSON % len(out) + out)
        else:
            data = y.tobytes()
            head = orjson.dumps(
                {
                    "model_name": "fraud_mlp",
                    "outputs": [
                        {
                            "name": self.output,
                            "datatype": "FP32",
                            "shape": list(y.shape),
                            "parameters": {"binary_data_size": len(data)},
                        }
                    ],
                }
            )
            self.transport.write(_OK_BIN % (len(head), len(head) + len(data)) + head + data)


async def main(model: str, port: int, fixed: bool) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    gets = described(session, "fraud_mlp", 64)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    loop = asyncio.get_running_loop()
    run = None if fixed else session
    server = await loop.create_server(lambda: Floor(run, output, gets), sock=sock, backlog=1024)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2]), "--fixed" in sys.argv[3:]))
