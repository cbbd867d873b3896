"""Well-behaved clients beside an attack or a drill, in a process of their own.

A good client's wait is what an attack cost others, so it must measure the server and
nothing else. In the attacker's process it measured the attacker too: building a 30 MB
body holds the interpreter for ~100 ms, and a thread of the same process waiting for its
answer waited that long (issue 24, item 5: the 153 ms of the large-JSON attack were in
part this). Here the good clients run in a spawned process, each recording every request
it makes (when it was sent, how long it took, how it ended); ``window`` picks the ones that
overlapped an interval.

- **http:** ``fraud_mlp`` over one keep-alive connection (JSON, one row), a request every
  ``http_interval_s`` (the next one is sent that long after the last answer);
- **grpc:** ``fraud_mlp`` over one channel, a call every ``grpc_interval_s``;
- **stream:** a generation server's model: a short streamed chat completion from another
  address (``GOOD_SOURCE``: another host, as the server sees it) every
  ``stream_interval_s``; its wait is the time to the first content chunk.

Which clients run is the caller's (``clients``): a tensor server gets ``http`` and ``grpc``,
a generation server ``stream``.
"""

from __future__ import annotations

import http.client
import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from typing import Any

import numpy as np
import orjson

from milliserve.drills.generation_wire import GOOD_SOURCE, good_stream
from milliserve.drills.target import Target

__all__ = ["CLIENTS", "Bystanders", "Sample", "Waits"]

CLIENTS = ("http", "grpc", "stream")

_INFER = "/inference.GRPCInferenceService/ModelInfer"
# one sample: (client, sent at (perf_counter, the same clock in every process), seconds, status)
Sample = tuple[str, float, float, str]
# one good request: its status ("ok" when answered) and its wait, None for the whole call
# (the stream client's is the time to its first token)
Call = Callable[[], tuple[str, float | None]]


@dataclass
class Waits:
    """What one good client saw over a window."""

    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    worst_s: float = 0.0
    p99_s: float = 0.0
    p50_s: float = 0.0
    # a failure's whole status per code, where it says more ("429: model 'smollm2': ...")
    examples: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, samples: list[tuple[float, str]]) -> Waits:
        waits = sorted(s for s, _ in samples)
        failed = [status for _, status in samples if status != "ok"]
        out = cls(len(samples), Counter(status.split(":", 1)[0] for status in failed))
        for status in failed:
            out.examples.setdefault(status.split(":", 1)[0], status)
        if waits:
            out.worst_s = waits[-1]
            # nearest rank: with fewer than 100 samples the p99 is the worst
            out.p99_s = waits[min(len(waits) - 1, int(np.ceil(0.99 * len(waits))) - 1)]
            out.p50_s = waits[(len(waits) - 1) // 2]
        return out

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def answered(self) -> int:
        return self.requests - self.failed


def _http_client(host: str, port: int) -> Call:
    x = np.random.default_rng(0).normal(size=(1, 64)).astype(np.float32)
    body = orjson.dumps(
        {"inputs": [{"name": "features", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}
    )
    headers = {"Content-Type": "application/json"}
    conn = [http.client.HTTPConnection(host, port, timeout=60)]

    def call() -> tuple[str, float | None]:
        try:
            conn[0].request("POST", "/v2/models/fraud_mlp/infer", body, headers)
            response = conn[0].getresponse()
            response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn[0].close()
            conn[0] = http.client.HTTPConnection(host, port, timeout=60)
            return type(exc).__name__, None
        if response.getheader("connection", "").lower() == "close":
            conn[0].close()
            conn[0] = http.client.HTTPConnection(host, port, timeout=60)
        return "ok" if response.status == 200 else str(response.status), None

    return call


def _grpc_client(host: str, port: int) -> Call:
    import grpc

    from milliserve.protocol.proto import oip_pb2 as pb

    channel = grpc.insecure_channel(f"{host}:{port}")
    call = channel.unary_unary(
        _INFER,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    msg = pb.ModelInferRequest(model_name="fraud_mlp")
    inp = msg.inputs.add(name="features", datatype="FP32")
    inp.shape.extend([1, 64])
    msg.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())

    def one() -> tuple[str, float | None]:
        try:
            call(msg, timeout=60)
        except grpc.RpcError as exc:
            return exc.code().name, None
        return "ok", None

    return one


def _stream_client(target: Target) -> Call:
    def one() -> tuple[str, float | None]:
        try:
            status, ttft = good_stream(target, GOOD_SOURCE)
        except OSError as exc:
            return f"error: {exc.__class__.__name__}", None
        return ("ok", ttft) if status == "200" else (status, None)

    return one


def _loop(name: str, call: Call, interval_s: float, out: Any, stop: EventType) -> None:
    while not stop.wait(interval_s):
        t0 = time.perf_counter()
        status, wait = call()
        out.put((name, t0, time.perf_counter() - t0 if wait is None else wait, status))


def _client(name: str, target: Target) -> Call:
    if name == "http":
        return _http_client(target.host, target.http_port)
    if name == "grpc":
        return _grpc_client(target.host, target.grpc_port)
    return _stream_client(target)


def _main(target: Target, intervals: dict[str, float], out: Any, stop: EventType) -> None:
    threads = [
        threading.Thread(target=_loop, args=(name, _client(name, target), interval, out, stop))
        for name, interval in intervals.items()
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


class Bystanders:
    """The good clients of ``target`` (``clients``, of ``CLIENTS``), in their own process
    while the context is open."""

    def __init__(
        self,
        target: Target,
        clients: tuple[str, ...] = ("http", "grpc"),
        http_interval_s: float = 0.002,
        grpc_interval_s: float = 0.1,
        stream_interval_s: float = 0.2,
    ) -> None:
        unknown = set(clients) - set(CLIENTS)
        if unknown or not clients:
            raise ValueError(f"good clients {sorted(unknown) or '(none)'}: expected some of {CLIENTS}")
        self.clients = clients
        every = {"http": http_interval_s, "grpc": grpc_interval_s, "stream": stream_interval_s}
        intervals = {name: every[name] for name in clients}
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with grpc's threads
        self._out: Any = ctx.Queue()
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_main, args=(target, intervals, self._out, self._stop), daemon=True)
        self._samples: list[Sample] = []
        self.last: list[Sample] = []  # the samples of the latest window
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._done = threading.Event()

    def __enter__(self) -> Bystanders:
        self._proc.start()
        self._reader.start()
        self.answered_since(time.perf_counter(), timeout_s=120)
        if not self._proc.is_alive():
            raise RuntimeError(f"the good clients' process ended (exit code {self._proc.exitcode})")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(timeout=120)
        if self._proc.is_alive():
            self._proc.kill()
        self._done.set()
        self._reader.join(timeout=10)

    def _read(self) -> None:
        while not (self._done.is_set() and self._out.empty()):
            try:
                sample = self._out.get(timeout=0.1)
            except queue.Empty:
                continue
            with self._lock:
                self._samples.append(sample)

    def answered_since(self, t: float, timeout_s: float = 120) -> None:
        """Wait until each client has been answered for a request sent after ``t`` (so that
        a window ending at ``t`` holds every request in flight then)."""
        end = time.perf_counter() + timeout_s
        while time.perf_counter() < end and self._proc.is_alive():
            with self._lock:
                seen = {name for name, sent, _, _ in reversed(self._samples[-2000:]) if sent >= t}
            if seen >= set(self.clients):
                return
            time.sleep(0.01)

    def take(self) -> list[Sample]:
        """Every sample recorded since the last ``take`` or ``window``, oldest first."""
        with self._lock:
            out, self._samples = self._samples, []
        return out

    def window(self, t0: float, t1: float) -> dict[str, Waits]:
        """Each client's requests that overlapped [t0, t1] (in flight at some moment of it),
        and its first one sent after ``t1`` (what the attack left behind, a backlog, is
        paid there); waits for that one's answer. Older samples are let go."""
        self.answered_since(t1)
        with self._lock:
            samples, self._samples = self._samples, [s for s in self._samples if s[1] > t1]
        picked: dict[str, list[tuple[float, str]]] = {name: [] for name in self.clients}
        after: dict[str, tuple[float, float, str]] = {}
        self.last = [s for s in samples if s[1] <= t1 and s[1] + s[2] >= t0]  # for a closer look
        for name, sent, took, status in samples:
            if sent <= t1:
                if sent + took >= t0:
                    picked[name].append((took, status))
            elif name not in after or sent < after[name][0]:
                after[name] = (sent, took, status)
        for name, (_, took, status) in after.items():
            picked[name].append((took, status))
        return {name: Waits.of(got) for name, got in picked.items()}
