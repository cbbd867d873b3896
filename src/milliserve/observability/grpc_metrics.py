"""Prometheus figures of the native gRPC listener (server/grpc/native.py): open
connections, and what hostile or broken clients cost (issue 29). Read at scrape time
from the listener's own counters, so the road pays nothing for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["GrpcListenerCollector"]

# counter name -> (its help, the key in the listener's figures)
_COUNTERS = {
    "milliserve_grpc_unread_cancelled": (
        "Calls cancelled because their client did not read the answer (zero window, unread socket)",
        "unread_cancelled",
    ),
    "milliserve_grpc_resets_received": ("Streams the clients reset (RST_STREAM)", "resets_received"),
    "milliserve_grpc_refused_streams": (
        "Streams refused for passing the concurrency limit",
        "refused_streams",
    ),
    "milliserve_grpc_goaway_calm": (
        "Connections ended with GOAWAY ENHANCE_YOUR_CALM (floods, Rapid Reset)",
        "goaway_calm",
    ),
    "milliserve_grpc_protocol_errors": ("Connections ended for an HTTP/2 protocol error", "protocol_errors"),
    "milliserve_grpc_refused_connections": (
        "Connections refused over max_connections or max_connections_per_peer",
        "refused_connections",
    ),
}


class GrpcListenerCollector(Collector):
    """Collects ``figures()``: a mapping with ``connections`` and each counter's key."""

    def __init__(self, figures: Callable[[], dict[str, int]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Any]:
        f = self._figures()
        yield GaugeMetricFamily("milliserve_grpc_connections", "Open gRPC connections", f["connections"])
        for name, (doc, key) in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, f[key])
