"""What an attack or a drill is aimed at: a running server's addresses and process."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Target"]


@dataclass(frozen=True)
class Target:
    """A server under attack. ``metrics_url`` (its Prometheus page) is needed by attacks on a
    generation server, whose window closes only once no sequence is running; ``model`` is
    the model those attacks ask for; ``quick`` runs their catalogue smaller (to check the
    suite, not to measure it)."""

    host: str
    http_port: int
    grpc_port: int
    pid: int
    metrics_port: int = 0  # where the per-worker metrics are, if known
    metrics_url: str = ""
    model: str = ""
    quick: bool = False

    def n(self, full: int, quick: int) -> int:
        """``full``, or ``quick`` for a quick run."""
        return quick if self.quick else full
