"""Probes milliserve's own tests send to a server: a body for the suite's ``slow`` model, a
POST that reports its status whatever happens, and the requests a model holds."""

from __future__ import annotations

import urllib.request
from typing import Any

__all__ = ["pending_requests", "post_status", "slow_body"]


def slow_body(batch: int = 1) -> dict[str, Any]:
    """An OIP JSON body for the tests' ``slow`` model (X [batch, 256, 256] of ones)."""
    ones = [1.0] * (batch * 256 * 256)
    return {"inputs": [{"name": "X", "shape": [batch, 256, 256], "datatype": "FP32", "data": ones}]}


def post_status(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> int | str:
    """POST ``body`` as JSON on a fresh connection: the HTTP status, or the error's name."""
    import httpx

    try:
        with httpx.Client(timeout=timeout_s) as c:
            return c.post(url, json=body).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def pending_requests(metrics_url: str, model: str) -> dict[str, float]:
    """``model``'s requests held (queued or running), from ``milliserve_pending_request_count``
    at ``metrics_url``: by ``worker`` label (``""`` for a lone server)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("milliserve_pending_request_count{") and f'model="{model}"' in line:
            labels, value = line.rsplit(" ", 1)
            worker = labels.split('worker="', 1)[1].split('"', 1)[0] if 'worker="' in labels else ""
            out[worker] = out.get(worker, 0.0) + float(value)
    return out
