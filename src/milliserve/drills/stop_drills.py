"""Reliability drills against a running server: clients in a closed loop while the server
is stopped (SIGTERM), or while one of its workers is killed and restarted, and what became
of every call they made.

A call ends one of three ways:

- **ok**: answered;
- **refused**: never accepted: the connection was refused, so the client knows the server
  did not run it and may send it elsewhere;
- **lost**: anything else (a reset, a broken pipe, a CANCELLED or otherwise failed call):
  the client cannot tell whether it ran. A graceful stop loses none; a worker killed loses
  the calls it held at that moment, and none after its restart.

``benchmarks/attack_suite.py`` runs these for its reliability table, and the tests hold
the server to zero lost.
"""

from __future__ import annotations

import collections
import http.client
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import orjson

from milliserve.drills.process_probe import workers_of

__all__ = ["DrillResult", "crash_drill", "sigterm_drill"]

_REFUSED = ("Connection refused", "failed to connect to all addresses")


@dataclass
class DrillResult:
    """What the clients of a drill saw."""

    ok: int = 0
    ok_after_signal: int = 0  # answered after the signal: the drain at work
    refused: int = 0
    lost: int = 0  # after the crash drill's restart, or in a SIGTERM drill
    exit_code: int | None = None
    lost_examples: list[str] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    # the crash drill: calls lost while a worker was killed and restarted, and how long
    # the restart took (killed to serving again)
    lost_at_crash: int = 0
    restart_s: float | None = None


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


class _Clients:
    """``clients`` threads calling ``model`` in a closed loop; a lost call is counted by the
    phase it ended in (``before``, ``crash``, ``after``, ``signal``), an answer after the
    signal by the phase it began in. A client stops at its first refused call after the
    signal (the server is gone), or at ``deadline``."""

    def __init__(
        self, url: str, protocol: str, model: str, input_name: str, shape: tuple[int, ...], clients: int
    ) -> None:
        self.x = np.zeros(shape, np.float32)
        self.body = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": input_name,
                        "shape": list(shape),
                        "datatype": "FP32",
                        "data": self.x.ravel().tolist(),
                    }
                ]
            }
        )
        self.url, self.protocol, self.model, self.input_name = url, protocol, model, input_name
        self.result = DrillResult()
        self.phase = "before"
        self.deadline = float("inf")
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def start(self, deadline: float) -> None:
        self.deadline = deadline
        for t in self.threads:
            t.start()

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout_s)

    def _client(self) -> None:
        if self.protocol == "http":
            call = _http_caller(self.url, self.model, self.body)
        else:
            call = _grpc_caller(self.url, self.model, self.input_name, self.x)
        result = self.result
        while time.monotonic() < self.deadline:
            phase = self.phase
            try:
                call()
                kind = "ok"
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                kind = "refused" if any(r in text for r in _REFUSED) else "lost"
            ended = self.phase  # a call cut by the crash began before it
            with self.lock:
                result.outcomes[kind if kind != "lost" else f"{ended}: {text[:120]}"] += 1
                if kind == "ok":
                    result.ok += 1
                    result.ok_after_signal += phase == "signal"
                elif kind == "refused":
                    result.refused += 1
                elif ended == "crash":
                    result.lost_at_crash += 1
                else:
                    result.lost += 1
                    if len(result.lost_examples) < 5:
                        result.lost_examples.append(text[:300])
            if kind == "refused" and phase == "signal":
                return


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
    c = _Clients(url, protocol, model, input_name, shape, clients)
    c.start(time.monotonic() + before_s + timeout_s)
    time.sleep(before_s)
    return _stop(proc, c, timeout_s)


def _stop(proc: subprocess.Popen[bytes], c: _Clients, timeout_s: float) -> DrillResult:
    c.phase = "signal"
    proc.send_signal(signal.SIGTERM)
    c.join(timeout_s)
    c.result.exit_code = proc.wait(timeout_s)
    return c.result


def crash_drill(
    proc: subprocess.Popen[bytes],
    url: str,
    protocol: str,
    serving: Callable[[], int],
    model: str = "fraud_mlp",
    input_name: str = "features",
    shape: tuple[int, ...] = (1, 64),
    clients: int = 8,
    before_s: float = 2.0,
    after_s: float = 2.0,
    timeout_s: float = 60.0,
) -> DrillResult:
    """As ``sigterm_drill`` against a ``serve --workers N`` parent, but first one of its
    workers is killed (SIGKILL) after ``before_s``: the calls it held are lost (``lost_at_
    crash``, with the restart's time in ``restart_s``); the clients go on until ``serving()``
    (how many times a worker started serving, from the server's log) has grown and
    ``after_s`` more (their reconnections count with the crash), then ``after_s`` on the
    restarted server, and then the parent gets SIGTERM and the drill ends as
    ``sigterm_drill`` does; ``lost`` counts the calls lost after the crash's share."""
    c = _Clients(url, protocol, model, input_name, shape, clients)
    c.start(time.monotonic() + before_s + 2 * timeout_s)
    time.sleep(before_s)
    served = serving()
    victim = workers_of(proc.pid)[0]
    killed = time.monotonic()
    c.phase = "crash"
    os.kill(victim, signal.SIGKILL)
    end = killed + timeout_s
    while serving() <= served and time.monotonic() < end:
        time.sleep(0.05)
    if serving() > served:
        c.result.restart_s = time.monotonic() - killed
    time.sleep(after_s)
    c.phase = "after"
    time.sleep(after_s)
    return _stop(proc, c, timeout_s)
