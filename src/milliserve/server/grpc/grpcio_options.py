"""grpc core channel arguments for the server, from ``GrpcSettings`` (issue 10).

The names are grpc core's (``grpc/impl/channel_arg_names.h``); each is one the chttp2
server transport reads.
"""

from __future__ import annotations

from milliserve.config.settings import GrpcSettings

__all__ = ["server_options"]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def server_options(settings: GrpcSettings, shared: bool = False) -> list[tuple[str, int]]:
    """The connection limits for ``grpc.aio.server(options=...)``; ``build_grpc_server``
    adds the message sizes. ``shared``: a worker of ``serve --workers N``."""
    return [
        # never share the port (grpc's default lets a second server bind it silently), except
        # between the workers of one server, which share it on purpose
        ("grpc.so_reuseport", 1 if shared else 0),
        # metadata over the soft limit is refused at random, over the hard limit always:
        # both at the same size, so the limit is one number
        ("grpc.max_metadata_size", settings.max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", settings.max_metadata_bytes),
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", settings.max_connections),
        ("grpc.server_handshake_timeout_ms", _ms(settings.handshake_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(settings.idle_timeout_s)),
        ("grpc.keepalive_time_ms", _ms(settings.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", _ms(settings.keepalive_timeout_s)),
        # clients may keep idle connections alive with pings, but not more often than this
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(settings.min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", settings.max_ping_strikes),
    ]
