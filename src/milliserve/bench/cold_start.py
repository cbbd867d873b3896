"""Cold start, measured through the repository API: unload, load, time until the
model is ready, the first request's latency, and how many requests pass before
p99 settles. Needs a server with the repository API on (milliserve
``--model-control-mode explicit``, Triton ``--model-control-mode=explicit``)."""

from __future__ import annotations

import http.client
import time
from dataclasses import asdict, dataclass

import numpy as np

from milliserve.bench.workload import Workload
from milliserve.errors import ConfigError
from milliserve.percentiles import percentile, percentiles

__all__ = ["ColdStart", "measure_cold_start"]

SETTLE_WINDOW = 50


@dataclass
class ColdStart:
    load_s: float  # load call until the model answers ready
    first_request_ms: float
    second_request_ms: float
    steady_p50_ms: float
    steady_p99_ms: float
    requests_to_settle: int  # requests before every later window of 50 keeps p99 within 1.2x steady

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _call(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp.read()


def requests_to_settle(latencies_ms: np.ndarray, window: int = SETTLE_WINDOW) -> int:
    """Index after which every window's p99 stays within 1.2x the p99 of the second half."""
    steady = percentile(latencies_ms[len(latencies_ms) // 2 :], 99)
    settle = 0
    for start in range(0, len(latencies_ms) - window + 1, window // 5):
        if percentile(latencies_ms[start : start + window], 99) > 1.2 * steady:
            settle = start + window
    return settle


def measure_cold_start(w: Workload, requests: int = 400) -> ColdStart:
    """Unload and load the model, then send ``requests`` sequential requests."""
    if w.target.protocol != "http":
        raise ConfigError("--cold-start uses the HTTP repository API; give an http:// target")
    conn = http.client.HTTPConnection(w.target.host, w.target.port, timeout=300)
    status, body = _call(conn, "POST", f"/v2/repository/models/{w.model}/unload", b"{}")
    if status != 200:
        raise ConfigError(
            f"cannot unload {w.model!r} ({status}: {body.decode(errors='replace')[:200]}); "
            "--cold-start needs the repository API (--model-control-mode explicit)"
        )
    t0 = time.perf_counter()
    status, body = _call(conn, "POST", f"/v2/repository/models/{w.model}/load", b"{}")
    if status != 200:
        raise ConfigError(f"loading {w.model!r} failed ({status}): {body.decode(errors='replace')[:200]}")
    while _call(conn, "GET", f"/v2/models/{w.model}/ready")[0] != 200:
        time.sleep(0.001)
    load_s = time.perf_counter() - t0
    latencies = []
    for i in range(requests):
        t = time.perf_counter()
        status, body = _call(conn, "POST", w.path, w.bodies[i % len(w.bodies)], w.headers[i % len(w.headers)])
        latencies.append((time.perf_counter() - t) * 1e3)
        if status != 200:
            raise ConfigError(
                f"request {i} after load failed ({status}): {body.decode(errors='replace')[:200]}"
            )
    conn.close()
    lat = np.asarray(latencies)
    p50, p99 = percentiles(lat[len(lat) // 2 :], [50, 99])
    return ColdStart(
        load_s,
        float(lat[0]),
        float(lat[1]),
        p50,
        p99,
        requests_to_settle(lat),
    )
