"""Server settings: one nested tree, read from the environment (prefix ``MILLISERVE_``,
nesting with ``__``, e.g. ``MILLISERVE_HTTP__PORT=9000``) and overridden by CLI flags.

This is the only module that reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "AuthSettings",
    "EdgeSettings",
    "GrpcSettings",
    "HttpSettings",
    "MetricsSettings",
    "RedisSettings",
    "Settings",
    "SharedMemorySettings",
    "TracingSettings",
    "cache_dir",
    "hf_offline_env",
    "ray_env",
]

MiB = 1024 * 1024


def _fd_share(divisor: int) -> int:
    """A listener's default connection cap: a share of this process's open-file limit
    (RLIMIT_NOFILE, soft), at most 10,000, so that a flood of connections is refused
    before it runs the process out of file descriptors."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return 10_000
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(1, min(10_000, soft // divisor))


class HttpSettings(BaseModel):
    """The HTTP listener. The limits also apply to the metrics port (issue 10)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    port: int = Field(8000, ge=0, le=65535)
    max_request_bytes: int = Field(32 * MiB, ge=1024)
    # a JSON body (or the JSON header of a binary one): decoding JSON holds the interpreter
    # in one call (orjson ~2 ms per MB of numbers, then as long again to make the arrays),
    # even off the event loop, so every other request waits that long; 2 MiB is a few
    # milliseconds, and large tensors come in the binary extension (the 413 says so);
    # at 16 MiB other clients waited 50 ms and more (issue 24, item 5)
    max_json_bytes: int = Field(2 * MiB, ge=1024)
    # the request line and all headers; more is answered 431 without reading it (h11's default)
    max_header_bytes: int = Field(16 * 1024, ge=1024)
    # from a connection's first byte (or from connecting) to its complete headers; then 408
    header_timeout_s: float = Field(10.0, gt=0)
    # from complete headers to the whole body; then 408
    body_timeout_s: float = Field(30.0, gt=0)
    # an idle keep-alive connection is closed after this; responses say `Keep-Alive: timeout=N`
    keep_alive_s: float = Field(5.0, gt=0)
    # open connections beyond this are answered 503 and closed at once; half the fd limit
    max_connections: int = Field(default_factory=lambda: _fd_share(2), ge=1)
    # a generation stream (SSE): its socket's send buffer, and how long one chunk may wait
    # for a client that stopped reading before the sequence is cancelled and the connection
    # closed (docs/llm.md)
    stream_buffer_bytes: int = Field(64 * 1024, ge=4096)
    stream_write_timeout_s: float = Field(15.0, gt=0)
    # a benchmark's witness: each request's first-byte and answer-written instants appended
    # here (server/wire_timing.py); off by default, and costs two clock reads per request
    wire_timing_file: Path | None = None


class GrpcSettings(BaseModel):
    """The gRPC listener. ``stack``: milliserve's own HTTP/2 server (``native``, the
    default: server/h2/h2_connection.py) or grpc.aio (``grpcio``, where each limit becomes a grpc
    core channel argument, server/grpc/grpcio_options.py; the limits marked native-only do not
    apply there)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    port: int = Field(8001, ge=0, le=65535)
    stack: Literal["native", "grpcio"] = "native"
    max_message_bytes: int = Field(32 * MiB, ge=1024)
    # all metadata (headers) of a call, as HTTP's max_header_bytes; more is refused
    max_metadata_bytes: int = Field(16 * 1024, ge=1024)
    # concurrent calls on one HTTP/2 connection; a client that opens more waits (grpc
    # clients queue them), one that ignores the limit has the extra streams refused
    max_concurrent_streams: int = Field(100, ge=1)
    # open connections; a quarter of the fd limit (HTTP has half)
    max_connections: int = Field(default_factory=lambda: _fd_share(4), ge=1)
    # open connections from one client address (native only)
    max_connections_per_peer: int = Field(256, ge=1)
    # streams a client resets (or opens past the concurrency limit) in one second, and
    # control frames (SETTINGS, PING, PRIORITY, RST_STREAM, tiny DATA, CONTINUATION) it
    # sends in one second (WINDOW_UPDATE apart, against ten times that); past either,
    # GOAWAY ENHANCE_YOUR_CALM and the connection is closed (Rapid Reset, CVE-2023-44487;
    # floods, CVE-2019-9512/9515/9518) (native only)
    max_resets_per_s: int = Field(200, ge=1)
    max_control_frames_per_s: int = Field(10_000, ge=10)
    # bytes of answers one connection may hold for a client that does not read them (a
    # zero flow-control window, or a socket it does not read); past it, or after
    # unread_timeout_s, the call is cancelled and counted (native only)
    max_unread_bytes: int = Field(4 * MiB, ge=64 * 1024)
    # request bytes a message larger than 64 KiB may have on the wire before it is taken up
    # (receive window granted past each stream's first 64 KiB), over all connections; a
    # message waits for its grant while others finish, and two max_message_bytes messages
    # per connection at most (native only)
    max_buffered_bytes: int = Field(512 * MiB, ge=MiB)
    unread_timeout_s: float = Field(30.0, gt=0)
    # from a unary call's headers to its whole request message (native only)
    request_timeout_s: float = Field(30.0, gt=0)
    # a connection older than this is sent GOAWAY (clients reconnect for their next call)
    # and closed connection_age_grace_s later; 0: no limit (native only)
    max_connection_age_s: float = Field(3600.0, ge=0)
    connection_age_grace_s: float = Field(30.0, ge=0)
    # from TCP accept to the client's HTTP/2 settings; a connection that sends nothing is closed
    handshake_timeout_s: float = Field(10.0, gt=0)
    # a connection without calls for this long is sent GOAWAY (clients reconnect on their next call)
    idle_timeout_s: float = Field(300.0, gt=0)
    # the server pings a connection quiet for this long, and closes it if the ping is not
    # answered within keepalive_timeout_s: peers that vanished without a FIN do not stay forever
    keepalive_time_s: float = Field(60.0, gt=0)
    keepalive_timeout_s: float = Field(20.0, gt=0)
    # client pings closer together than this (without data) are strikes; after
    # max_ping_strikes the connection is closed (ping floods)
    min_ping_interval_s: float = Field(10.0, gt=0)
    max_ping_strikes: int = Field(2, ge=0)


class MetricsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    port: int = Field(8002, ge=0, le=65535)


class RedisSettings(BaseModel):
    """Redis for response caches with ``backend: redis`` (and, later, feature stores)."""

    url: str = "redis://127.0.0.1:6379/0"
    # Every Redis call is bounded by this and by the request's deadline; a call that
    # takes longer is a miss. 50 ms, because on a 2-vCPU shared machine a healthy Redis
    # round trip under CPU contention takes several ms, with a tail in the tens: a 5 ms
    # bound turned a busy Redis into a stream of timeouts (issue 10).
    timeout_ms: float = Field(50.0, gt=0)
    # 5 failures within 1 s leave Redis alone this long; then one trial call decides
    backoff_s: float = Field(1.0, ge=0)


class AuthSettings(BaseModel):
    """Optional token authentication (``--auth-token``, ``MILLISERVE_AUTH__TOKEN``)."""

    model_config = ConfigDict(extra="forbid")
    # required as `Authorization: Bearer <token>` or `x-api-key` on every inference,
    # metadata and repository call (HTTP and gRPC); None: no authentication
    token: SecretStr | None = None
    # health (/v2/health/*, gRPC ServerLive/ServerReady/ModelReady) and metrics stay open
    # unless these close them
    protect_health: bool = False
    protect_metrics: bool = False

    @field_validator("token", mode="before")
    @classmethod
    def _nonempty(cls, v: object) -> object:
        if isinstance(v, str) and not v.strip():
            raise ValueError("the auth token is empty; give a token or leave it unset")
        return v


class EdgeSettings(BaseModel):
    """Browser bundles (``milliserve edge build``) served at ``/edge/<model>/``: off unless
    ``dir`` is set. Every bundle in it (a folder with a manifest.json) is published, model
    file included, to anyone who can reach the HTTP port: no token is asked for them."""

    model_config = ConfigDict(extra="forbid")
    dir: Path | None = None
    # the model file and ORT's runtime have content-hashed or versioned names: cached for a year
    immutable_max_age_s: int = Field(365 * 24 * 3600, ge=0)

    @field_validator("dir", mode="before")
    @classmethod
    def _named(cls, v: object) -> object:
        if isinstance(v, str) and not v.strip():
            raise ValueError("an empty path; give the folder of bundles (milliserve edge build --out)")
        return v


class SharedMemorySettings(BaseModel):
    """Triton's system shared memory (``--shared-memory system``): clients on this machine
    pass tensors through POSIX shared-memory objects they register. Off by default: it lets
    a client have the server read and write memory it names. Loopback peers only."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["off", "system"] = "off"
    # keys a client may register must start with this (e.g. "/myapp_"); "" lets any POSIX
    # shared-memory name that the server's user can open be registered
    key_prefix: str = ""
    # regions and mapped bytes one client (peer address) may hold at once
    max_regions_per_client: int = Field(64, ge=1)
    max_bytes_per_client: int = Field(1 << 30, ge=1)

    @field_validator("key_prefix")
    @classmethod
    def _posix(cls, v: str) -> str:
        if v and (not v.startswith("/") or "/" in v[1:]):
            raise ValueError(f"{v!r} is not the start of a POSIX shared-memory name like '/myapp_'")
        return v


def _otel_env(name: str) -> str | None:
    # OpenTelemetry's own variables (the SDK's specification), read here like every other
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    return os.environ.get(name) or None


class TracingSettings(BaseModel):
    """OpenTelemetry traces per stage (observability/tracing.py), exported over OTLP/HTTP:
    off unless ``otlp_endpoint`` is set (``--otlp-endpoint``, or OpenTelemetry's standard
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is taken as the
    full traces URL; ``OTEL_SDK_DISABLED=true`` turns both off)."""

    model_config = ConfigDict(extra="forbid")
    # the collector's base URL: spans go to <otlp_endpoint>/v1/traces (OTLP/HTTP, protobuf)
    otlp_endpoint: str | None = Field(default_factory=lambda: _otel_env("OTEL_EXPORTER_OTLP_ENDPOINT"))
    traces_endpoint: str | None = Field(
        default_factory=lambda: _otel_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    service_name: str = Field(default_factory=lambda: os.environ.get("OTEL_SERVICE_NAME") or "milliserve")
    # how long one export may take before the batch is dropped (the SDK retries with backoff)
    export_timeout_s: float = Field(10.0, gt=0)
    # the share of requests traced that bring no caller's decision (a traceparent's sampled
    # flag is always followed); OpenTelemetry's OTEL_TRACES_SAMPLER, when set, replaces this
    sample_ratio: float = Field(0.01, ge=0.0, le=1.0)

    @field_validator("otlp_endpoint", "traces_endpoint")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"an OTLP/HTTP endpoint is an http:// or https:// URL, got {v!r}")
        return v

    def traces_url(self) -> str | None:
        """Where spans are sent, or None when tracing is off."""
        if self.traces_endpoint:
            return self.traces_endpoint
        if not self.otlp_endpoint:
            return None
        base = self.otlp_endpoint.rstrip("/")
        return base if base.endswith("/v1/traces") else base + "/v1/traces"


class Settings(BaseSettings):
    """Everything a server needs. Defaults are safe: loopback only, repository API off."""

    model_config = SettingsConfigDict(
        env_prefix="MILLISERVE_",
        env_nested_delimiter="__",
        extra="forbid",
        protected_namespaces=(),
    )

    model_repository: Path | None = None
    host: str = "127.0.0.1"
    http: HttpSettings = HttpSettings()
    grpc: GrpcSettings = GrpcSettings()
    metrics: MetricsSettings = MetricsSettings()
    redis: RedisSettings = RedisSettings()
    # none: load every model at start; poll: and follow the repository's changes every
    # repository_poll_s; explicit: the repository API loads and unloads (as Triton's modes)
    model_control_mode: Literal["none", "poll", "explicit"] = "none"
    # Models to load at start in explicit mode ("*" = all), as Triton's --load-model.
    load_models: list[str] = []
    repository_poll_s: float = Field(15.0, gt=0)
    # MiB the generative (GGUF) models may take together, measured resident: set, they load
    # on their first request and idle ones unload, least recently used first (0: all load at
    # start, as other models; docs/llm.md)
    llm_memory_mib: int = Field(0, ge=0)
    shared_memory: SharedMemorySettings = SharedMemorySettings()
    log_level: str = "INFO"
    # Seconds to finish in-flight requests after SIGTERM before giving up.
    shutdown_grace_s: float = Field(30.0, ge=0)
    auth: AuthSettings = AuthSettings()
    # Ready means every model that should serve does (Triton's --strict-readiness); off:
    # ready as long as the server answers, whatever failed to load.
    strict_readiness: bool = True
    # Whether error messages may list the repository's models (a 404 for an unknown one).
    expose_model_names: bool = False
    # "auto": keep the event loop on one CPU and run microsecond models' workers beside it
    # (Linux); "off": leave thread placement to the OS.
    cpu_affinity: Literal["auto", "off"] = "auto"
    edge: EdgeSettings = EdgeSettings()
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    # processes sharing the ports (`serve --workers N`), each with its own copy of the models;
    # a parent starts, watches, restarts and drains them
    workers: int = Field(1, ge=1, le=64)


def cache_dir() -> Path:
    """Where built artefacts are cached between runs: ``$MILLISERVE_CACHE`` (default
    ``~/.cache/milliserve``)."""
    return Path(os.environ.get("MILLISERVE_CACHE", Path.home() / ".cache" / "milliserve"))


def ray_env() -> dict[str, str]:
    """Environment for Ray processes: stay on 127.0.0.1 (without the first variable Ray
    swaps loopback for the machine's own address) and send no usage statistics."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def hf_offline_env() -> dict[str, str]:
    """Environment for code that touches Hugging Face libraries: never reach a model hub."""
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env
