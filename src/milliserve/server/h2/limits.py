"""What one HTTP/2 connection may hold or do (``Http2Limits``), what connections were
stopped for (``ConnectionStats``), and the per-second counts of frames that cost the
server work and the client nothing (``FrameRates``): past a rate, GOAWAY ENHANCE_YOUR_CALM."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from milliserve.server.h2.frames import Http2Calm

__all__ = ["ConnectionStats", "FrameRates", "Http2Limits"]


@dataclass(frozen=True, slots=True)
class Http2Limits:
    """What one connection may hold or do; from ``GrpcSettings`` (config/settings.py)."""

    max_concurrent_streams: int = 100
    max_header_list_bytes: int = 16 * 1024
    max_message_bytes: int = 32 * 1024 * 1024
    max_resets_per_s: int = 200
    max_control_frames_per_s: int = 10_000
    min_ping_interval_s: float = 10.0
    max_ping_strikes: int = 2
    max_unread_bytes: int = 4 * 1024 * 1024
    unread_timeout_s: float = 30.0
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    max_buffered_bytes: int = 512 * 1024 * 1024  # window granted past the first 64 KiB, all connections
    max_connection_age_s: float = 0.0  # 0: no limit
    connection_age_grace_s: float = 30.0
    request_timeout_s: float = 30.0  # headers to the whole request of a unary call


class ConnectionStats:
    """What connections were stopped for; read by the metrics."""

    __slots__ = ("goaway_calm", "protocol_errors", "refused_streams", "resets_received", "unread_cancelled")

    def __init__(self) -> None:
        self.goaway_calm = 0  # connections sent GOAWAY ENHANCE_YOUR_CALM (floods)
        self.protocol_errors = 0
        self.refused_streams = 0
        self.resets_received = 0
        self.unread_cancelled = 0  # streams reset because their answer was not read


class FrameRates:
    """One connection's counts in the current second: control frames (SETTINGS, PING,
    PRIORITY, RST_STREAM, CONTINUATION, tiny DATA), WINDOW_UPDATE frames, and streams reset
    or refused. Each raises ``Http2Calm`` past its limit."""

    __slots__ = ("_clock", "_controls", "_limits", "_resets", "_start", "_window_updates")

    def __init__(self, limits: Http2Limits, clock: Callable[[], float]) -> None:
        self._limits = limits
        self._clock = clock
        self._start = 0.0
        self._resets = 0
        self._controls = 0
        self._window_updates = 0

    def _second(self) -> None:
        now = self._clock()
        if now - self._start >= 1.0:
            self._start = now
            self._resets = 0
            self._controls = 0
            self._window_updates = 0

    def control(self) -> None:
        self._second()
        self._controls += 1
        if self._controls > self._limits.max_control_frames_per_s:
            raise Http2Calm(f"more than {self._limits.max_control_frames_per_s} control frames in a second")

    def window_update(self) -> None:
        # an honest client sends one for about every answer (10k a second at 8 threads of
        # grpcio): counted apart, with ten times the control-frame budget
        self._second()
        self._window_updates += 1
        limit = 10 * self._limits.max_control_frames_per_s
        if self._window_updates > limit:
            raise Http2Calm(f"more than {limit} WINDOW_UPDATE frames in a second")

    def reset(self) -> None:
        """A stream reset by the client (Rapid Reset); counted after ``control``."""
        self._resets += 1
        if self._resets > self._limits.max_resets_per_s:
            raise Http2Calm(f"more than {self._limits.max_resets_per_s} streams reset in a second")

    def refused(self) -> None:
        """A stream refused past the concurrency limit: counted with the resets, so that
        opening and dropping streams stays bounded."""
        self._second()
        self._resets += 1
        if self._resets > self._limits.max_resets_per_s:
            raise Http2Calm("streams past the concurrency limit, again and again")
