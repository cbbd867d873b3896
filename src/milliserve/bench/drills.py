"""Reliability drills against a running server: clients in a closed loop while the server
is stopped, and what became of every call they made.

A call ends one of three ways:

- **ok**: answered;
- **refused**: never accepted: the connection was refused, so the client knows the server
  did not run it and may send it elsewhere;
- **lost**: anything else (a reset, a broken pipe, a CANCELLED or otherwise failed call):
  the client cannot tell whether it ran. A graceful stop loses none.

``benchmarks/attack_suite.py`` runs these for its reliability table, and the tests hold
the server to zero lost.
"""

from __future__ import annotations

import collections
import http.client
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import orjson

__all__ = ["DrillResult", "sigterm_drill"]

_REFUSED = ("Connection refused", "failed to connect to all addresses")


@dataclass
class DrillResult:
    """What the clients of a drill saw."""

    ok: int = 0
    ok_after_signal: int = 0  # answered after the signal: the drain at work
    refused: int = 0
    lost: int = 0
    exit_code: int | None = None
    lost_examples: list[str] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)


def _http_caller(url: str, model: str, body: bytes) -> Callable[[], None]:
    host, port = url.rsplit(":", 1)
    conn = [http.client.HTTPConnection(host, int(port), timeout=30)]

    def call() -> None:
        try:
            conn[0].request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
            response = conn[0].getresponse()
            data = response.read()
        except Exception:
            conn[0].close()
            conn[0] = http.client.HTTPConnection(host, int(port), timeout=30)
            raise
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
        if response.getheader("connection", "").lower() == "close":
            conn[0].close()
            conn[0] = http.client.HTTPConnection(host, int(port), timeout=30)

    return call


def _grpc_caller(url: str, model: str, name: str, x: np.ndarray) -> Callable[[], None]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)

    def call() -> None:
        client.infer(model, [tensor])

    return call


def sigterm_drill(
    proc: subprocess.Popen[bytes],
    url: str,
    protocol: str,
    model: str = "fraud_mlp",
    input_name: str = "features",
    shape: tuple[int, ...] = (1, 64),
    clients: int = 8,
    before_s: float = 2.0,
    timeout_s: float = 60.0,
) -> DrillResult:
    """``clients`` threads call ``model`` over ``protocol`` (``http`` or ``grpc``) in a
    closed loop; after ``before_s`` the server process gets SIGTERM. Each client stops at its
    first refused call (the server is gone) or after ``timeout_s``. Waits for the exit."""
    x = np.zeros(shape, np.float32)
    body = orjson.dumps(
        {
            "inputs": [
                {"name": input_name, "shape": list(shape), "datatype": "FP32", "data": x.ravel().tolist()}
            ]
        }
    )
    result = DrillResult()
    lock = threading.Lock()
    signalled = threading.Event()
    deadline = time.monotonic() + before_s + timeout_s

    def client() -> None:
        call = (
            _http_caller(url, model, body) if protocol == "http" else _grpc_caller(url, model, input_name, x)
        )
        while time.monotonic() < deadline:
            after = signalled.is_set()
            try:
                call()
                kind = "ok"
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                kind = "refused" if any(r in text for r in _REFUSED) else "lost"
            with lock:
                result.outcomes[kind if kind != "lost" else text[:120]] += 1
                if kind == "ok":
                    result.ok += 1
                    result.ok_after_signal += after
                elif kind == "refused":
                    result.refused += 1
                else:
                    result.lost += 1
                    if len(result.lost_examples) < 5:
                        result.lost_examples.append(text[:300])
            if kind == "refused" and after:
                return

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(before_s)
    proc.send_signal(signal.SIGTERM)
    signalled.set()
    for t in threads:
        t.join(timeout_s)
    result.exit_code = proc.wait(timeout_s)
    return result
