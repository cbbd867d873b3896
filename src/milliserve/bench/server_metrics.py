"""Server-side split of latency from a Prometheus endpoint, scraped before and after
a window: queue and compute time per request, and the mean batch size.

Understands milliserve's metric names and Triton's (``nv_inference_*``), so the
same report works against either.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Snapshot", "scrape", "server_split"]

Snapshot = dict[str, float]

# (our key, metric sample name, unit factor to µs)
_MILLISERVE = {
    "success": ("milliserve_inference_request_success_total", 1.0),
    "count": ("milliserve_inference_count_total", 1.0),
    "exec": ("milliserve_inference_exec_count_total", 1.0),
    "request_us": ("milliserve_request_duration_seconds_sum", 1e6),
    "queue_us": ("milliserve_queue_duration_seconds_sum", 1e6),
    "queue_n": ("milliserve_queue_duration_seconds_count", 1.0),
    "compute_input_us": ("milliserve_compute_input_duration_seconds_sum", 1e6),
    "compute_infer_us": ("milliserve_compute_infer_duration_seconds_sum", 1e6),
    "compute_output_us": ("milliserve_compute_output_duration_seconds_sum", 1e6),
    "exec_n": ("milliserve_compute_infer_duration_seconds_count", 1.0),
}
_TRITON = {
    "success": ("nv_inference_request_success", 1.0),
    "count": ("nv_inference_count", 1.0),
    "exec": ("nv_inference_exec_count", 1.0),
    "request_us": ("nv_inference_request_duration_us", 1.0),
    "queue_us": ("nv_inference_queue_duration_us", 1.0),
    "compute_input_us": ("nv_inference_compute_input_duration_us", 1.0),
    "compute_infer_us": ("nv_inference_compute_infer_duration_us", 1.0),
    "compute_output_us": ("nv_inference_compute_output_duration_us", 1.0),
}


def scrape(url: str, model: str) -> Snapshot | None:
    """Sum the model's samples (all versions) from a Prometheus endpoint; None if unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") == model:
                samples[s.name] = samples.get(s.name, 0.0) + s.value
    table = _MILLISERVE if any(k.startswith("milliserve_") for k in samples) else _TRITON
    snap = {"triton": 0.0 if table is _MILLISERVE else 1.0}
    for key, (name, factor) in table.items():
        if name in samples:
            snap[key] = samples[name] * factor
    return snap


def server_split(before: Snapshot | None, after: Snapshot | None) -> dict[str, float] | None:
    """Per-request server times (µs) and mean batch size between two snapshots."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    requests = d.get("success", 0.0)
    if requests <= 0:
        return None
    out = {"requests": requests}
    if d.get("exec", 0) > 0:
        out["avg_batch_size"] = d.get("count", 0.0) / d["exec"]
    if "queue_us" in d:
        out["queue_us"] = d["queue_us"] / (d.get("queue_n") or requests)
    if after.get("triton"):
        # Triton's cumulative durations are per request already
        compute = sum(d.get(k, 0.0) for k in ("compute_input_us", "compute_infer_us", "compute_output_us"))
        out["compute_us"] = compute / requests
    elif d.get("exec_n", 0) > 0:
        # milliserve observes compute once per batch: every request of the batch waits for all of it
        compute = sum(d.get(k, 0.0) for k in ("compute_input_us", "compute_infer_us", "compute_output_us"))
        out["compute_us"] = compute / d["exec_n"]
    if "request_us" in d:
        out["server_total_us"] = d["request_us"] / requests
        out["other_us"] = max(
            0.0, out["server_total_us"] - out.get("queue_us", 0.0) - out.get("compute_us", 0.0)
        )
    return out
