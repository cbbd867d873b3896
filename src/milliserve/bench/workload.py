"""What ``milliserve bench`` sends: a target, the model's inputs from its metadata,
and the request bodies, encoded once before the run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import orjson

from milliserve.bench.grpc_client import GrpcClient
from milliserve.bench.http_client import HttpClient, HttpRequests
from milliserve.bench.records import Recorder
from milliserve.bench.text_stream import read_texts, text_stream
from milliserve.errors import ConfigError
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.proto import oip_pb2 as pb
from milliserve.protocol.raw import array_to_raw

__all__ = ["Target", "Workload", "build_workload", "parse_target"]


@dataclass(frozen=True)
class Target:
    """Where requests go: ``http://host:port`` or ``grpc://host:port``."""

    protocol: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.protocol}://{self.host}:{self.port}"

    @property
    def http_base(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Workload:
    """Pre-encoded requests for one model on one target. ``bodies`` are sent round-robin."""

    target: Target
    model: str
    version: str
    bodies: list[bytes]
    # HTTP only: headers per body (binary extension needs Inference-Header-Content-Length)
    headers: list[dict[str, str]] = field(default_factory=list)
    # HTTP only: send the request head and body in two writes, as libcurl does (perf_analyzer,
    # the C++ tritonclient). The server then wakes twice per request, which costs it CPU.
    split_writes: bool = False

    @property
    def path(self) -> str:
        v = f"/versions/{self.version}" if self.version else ""
        return f"/v2/models/{self.model}{v}/infer"

    def raw_http(self) -> list[tuple[bytes, ...]]:
        """Each request as the bytes to write: one write, or the head and the body apart."""
        out: list[tuple[bytes, ...]] = []
        for body, headers in zip(self.bodies, self.headers, strict=True):
            head = f"POST {self.path} HTTP/1.1\r\nHost: {self.target.host}:{self.target.port}\r\n"
            head += f"Content-Length: {len(body)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            out.append((head.encode(), body) if self.split_writes else (head.encode() + body,))
        return out

    def client(self, rec: Recorder, finished: Callable[[int], None]) -> HttpClient | GrpcClient:
        t = self.target
        if t.protocol == "grpc":
            return GrpcClient(t.host, t.port, self.bodies, rec, finished)
        return HttpClient(HttpRequests(t.host, t.port, self.raw_http()), rec, finished)


def parse_target(url: str) -> Target:
    """Parse a target URL; raises ConfigError naming what is wrong."""
    u = urlparse(url if "://" in url else f"http://{url}")
    if u.scheme not in ("http", "grpc") or not u.hostname or not u.port:
        raise ConfigError(f"target {url!r} must look like http://host:port or grpc://host:port")
    return Target(u.scheme, u.hostname, u.port)


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:200]
        raise ConfigError(f"GET {url} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None


def _grpc_call(target: Target, method: str, request: Any, response_cls: Any) -> Any:
    import grpc

    with grpc.insecure_channel(f"{target.host}:{target.port}") as ch:
        call = ch.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString,
        )
        try:
            return call(request, timeout=5)
        except grpc.RpcError as exc:
            raise ConfigError(f"{target}: {method} failed: {exc.code().name}: {exc.details()}") from None


def fetch_model(target: Target, model: str, version: str) -> tuple[dict[str, Any], int]:
    """The model's metadata and max_batch_size (0 when the server has no config endpoint)."""
    from google.protobuf import json_format

    v = f"/versions/{version}" if version else ""
    if target.protocol == "http":
        meta = _get_json(f"{target.http_base}/v2/models/{model}{v}")
        try:
            cfg = _get_json(f"{target.http_base}/v2/models/{model}{v}/config")
        except ConfigError:
            cfg = {}
        return meta, int(cfg.get("max_batch_size", 0))
    meta_msg = _grpc_call(
        target,
        "ModelMetadata",
        pb.ModelMetadataRequest(name=model, version=version),
        pb.ModelMetadataResponse,
    )
    meta = json_format.MessageToDict(meta_msg, preserving_proto_field_name=True)
    for t in (*meta.get("inputs", []), *meta.get("outputs", [])):
        t["shape"] = [int(d) for d in t.get("shape", [])]
    try:
        cfg = _grpc_call(
            target, "ModelConfig", pb.ModelConfigRequest(name=model, version=version), pb.ModelConfigResponse
        )
        max_batch = int(cfg.config.max_batch_size)
    except ConfigError:
        max_batch = 0
    return meta, max_batch


def _resolve_shape(
    name: str, declared: list[int], batching: bool, batch: int, given: list[int] | None
) -> list[int]:
    inner = declared[1:] if batching else declared
    if given is not None:
        if len(given) != len(inner) or any(d != -1 and d != g for d, g in zip(inner, given, strict=True)):
            raise ConfigError(
                f"--shape {name}:{','.join(map(str, given))} does not match the model's "
                f"{declared} (give the dims after the batch dimension)"
            )
        inner = given
    if any(d < 0 for d in inner):
        raise ConfigError(f"input {name!r} has variable dims {declared}; give them with --shape {name}:DIMS")
    return ([batch] if batching else []) + list(inner)


def _data(datatype: str, shape: list[int], kind: str, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if datatype == BYTES:
        return np.array([b"milliserve" if kind == "random" else b""] * prod(shape), dtype=object).reshape(
            shape
        )
    dtype = oip_to_numpy(datatype)
    if kind == "zero":
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 100, shape).astype(dtype)  # small ints: valid token ids, indices


def _encode_http(
    model: str, tensors: list[tuple[str, str, np.ndarray[Any, Any]]], binary: bool
) -> tuple[bytes, dict[str, str]]:
    if not binary:
        doc = {
            "inputs": [
                {
                    "name": n,
                    "datatype": d,
                    "shape": list(a.shape),
                    "data": [x.decode() for x in a.reshape(-1)] if d == BYTES else a.reshape(-1).tolist(),
                }
                for n, d, a in tensors
            ]
        }
        return orjson.dumps(doc), {"Content-Type": "application/json"}
    blobs = [array_to_raw(d, a) for _, d, a in tensors]
    header = orjson.dumps(
        {
            "inputs": [
                {"name": n, "datatype": d, "shape": list(a.shape), "parameters": {"binary_data_size": len(b)}}
                for (n, d, a), b in zip(tensors, blobs, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    return header + b"".join(blobs), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


def _add(
    target: Target,
    model: str,
    version: str,
    tensors: list[tuple[str, str, np.ndarray[Any, Any]]],
    binary: bool,
    bodies: list[bytes],
    headers: list[dict[str, str]],
) -> None:
    """Encode one request for the target's protocol onto ``bodies`` (and HTTP ``headers``)."""
    if target.protocol == "grpc":
        bodies.append(_encode_grpc(model, version, tensors))
    else:
        body, head = _encode_http(model, tensors, binary)
        bodies.append(body)
        headers.append(head)


def _encode_grpc(model: str, version: str, tensors: list[tuple[str, str, np.ndarray[Any, Any]]]) -> bytes:
    msg = pb.ModelInferRequest(model_name=model, model_version=version)
    for n, d, a in tensors:
        msg.inputs.add(name=n, datatype=d, shape=list(a.shape))
        msg.raw_input_contents.append(array_to_raw(d, a))
    return bytes(msg.SerializeToString())


def build_workload(
    target: Target,
    model: str,
    version: str = "",
    batch: int = 1,
    data: str = "random",
    shapes: dict[str, list[int]] | None = None,
    binary: bool = True,
    variants: int = 8,
    zipf: float | None = None,
    text_input: str | None = None,
) -> Workload:
    """Fetch the model's inputs and encode ``variants`` request bodies.

    ``data`` is ``random``, ``zero`` or a path to a JSON file holding a list of OIP
    request bodies (sent as they are, over HTTP JSON). Raises ConfigError for an
    unreachable target, an unknown model, or shapes that do not fit the model.
    ``data`` may also be a ``.txt`` file of texts, one per line, for a model with a BYTES
    input (``text_input``, default the model's only BYTES input): each body carries one
    text, in file order or as a Zipf stream (``zipf``; see bench/text_stream.py).
    """
    if data.endswith(".txt"):
        return _text_workload(target, model, version, Path(data), zipf, text_input, binary)
    if zipf is not None or text_input is not None:
        raise ConfigError("--zipf and --text-input go with --data FILE.txt (texts, one per line)")
    if data not in ("random", "zero"):
        # a file of request bodies is sent as it is: no metadata needed, so servers that
        # only implement the infer route (the peers in benchmarks/peers) can be measured too
        path = Path(data)
        if not path.is_file():
            raise ConfigError(f"--data {data!r} is neither random, zero nor a file")
        requests = json.loads(path.read_text())
        if target.protocol != "http" or not isinstance(requests, list) or not requests:
            raise ConfigError(f"{path}: give a non-empty JSON list of OIP request bodies (HTTP targets only)")
        return Workload(
            target,
            model,
            version,
            [orjson.dumps(r) for r in requests],
            [{"Content-Type": "application/json"}] * len(requests),
        )
    meta, max_batch = fetch_model(target, model, version)
    shapes = shapes or {}
    unknown = sorted(set(shapes) - {t["name"] for t in meta["inputs"]})
    if unknown:
        raise ConfigError(
            f"--shape names {unknown}, which are not inputs of {model!r} "
            f"({[t['name'] for t in meta['inputs']]})"
        )
    if batch < 1 or (max_batch and batch > max_batch):
        raise ConfigError(f"batch size {batch} is outside 1..{max_batch or 1} for model {model!r}")
    rng = np.random.default_rng(0)
    bodies: list[bytes] = []
    headers: list[dict[str, str]] = []
    for _ in range(variants if data == "random" else 1):
        tensors = []
        for t in meta["inputs"]:
            shape = _resolve_shape(t["name"], t["shape"], max_batch > 0, batch, shapes.get(t["name"]))
            tensors.append((t["name"], t["datatype"], _data(t["datatype"], shape, data, rng)))
        _add(target, model, version, tensors, binary, bodies, headers)
    return Workload(target, model, version, bodies, headers)


def _text_workload(
    target: Target,
    model: str,
    version: str,
    path: Path,
    zipf: float | None,
    text_input: str | None,
    binary: bool,
) -> Workload:
    """One body per text of the stream. Without ``text_input`` the model's metadata names
    its BYTES input; with it, no metadata is read (a peer that only serves infer works)."""
    if not path.is_file():
        raise ConfigError(f"--data {str(path)!r}: no such file")
    stream = text_stream(read_texts(path), zipf)
    shape: tuple[int, ...] = (1, 1)
    if text_input is None:
        meta, max_batch = fetch_model(target, model, version)
        texts_in = [t for t in meta["inputs"] if t["datatype"] == BYTES]
        if len(meta["inputs"]) != 1 or len(texts_in) != 1:
            raise ConfigError(
                f"--data {path.name}: model {model!r} has inputs "
                f"{[(t['name'], t['datatype']) for t in meta['inputs']]}; texts need exactly one BYTES input"
            )
        text_input = texts_in[0]["name"]
        shape = (1, 1) if max_batch > 0 else (1,)
    bodies: list[bytes] = []
    headers: list[dict[str, str]] = []
    for text in stream:
        tensors = [(text_input, BYTES, np.array([text.encode()], dtype=object).reshape(shape))]
        _add(target, model, version, tensors, binary, bodies, headers)
    return Workload(target, model, version, bodies, headers)
