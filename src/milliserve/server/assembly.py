"""Build a server from Settings; start and stop HTTP, gRPC and metrics together.

Shutdown order (SIGTERM or Ctrl-C): report not-ready, stop accepting new
connections, let in-flight HTTP requests and gRPC calls finish (up to
``shutdown_grace_s``), drain every batcher, release the models.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from milliserve.cache.response_cache import CacheFactory
from milliserve.config.settings import Settings
from milliserve.errors import ConfigError
from milliserve.observability.grpc_metrics import GrpcListenerCollector
from milliserve.observability.metrics import Metrics
from milliserve.observability.tracing import TracedDataPlane, TracedHttp, Tracing
from milliserve.repository.model_registry import ModelRegistry
from milliserve.repository.poll import RepositoryPoller
from milliserve.repository.repository import Repository
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.executor import Executor
from milliserve.server.auth import Auth
from milliserve.server.grpc.grpcio_options import server_options
from milliserve.server.grpc.native import NativeGrpcServer
from milliserve.server.grpc.servicer import CallCount, build_grpc_server
from milliserve.server.h2.limits import Http2Limits
from milliserve.server.http.app import HttpApp
from milliserve.server.http.connection import HttpProtocol
from milliserve.server.http.cycle import Express
from milliserve.server.http.edge_files import EdgeFiles
from milliserve.server.http.listener import ConnectionLimits
from milliserve.server.http.server import HttpServer
from milliserve.server.listeners import (
    GRPC,
    HTTP,
    METRICS,
    WorkerSlot,
    bind_grpc,
    bind_tcp,
    inherited,
)
from milliserve.server.metrics_app import MetricsApp
from milliserve.server.peers import Peers
from milliserve.server.shm.service import SharedMemoryService
from milliserve.server.wire_timing import WireLog, timed_protocol

__all__ = ["Server", "serve"]

log = logging.getLogger(__name__)

# the metrics port serves a scraper or two: a small share of the file descriptors is plenty
METRICS_MAX_CONNECTIONS = 64


class Server:
    """A running milliserve: ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        settings: Settings,
        prometheus_registry: CollectorRegistry | None = None,
        worker: WorkerSlot | None = None,
    ) -> None:
        if settings.model_repository is None:
            raise ConfigError("no model repository given (milliserve serve MODEL_REPOSITORY)")
        self.settings = settings
        self.prometheus_registry = prometheus_registry or CollectorRegistry()
        self.executor = Executor(
            cpu_affinity=settings.cpu_affinity == "auto", worker_index=worker.index if worker else 0
        )
        redis = settings.redis
        self.caches = CacheFactory(redis.url, redis.timeout_ms / 1000, redis.backoff_s)
        self.registry = ModelRegistry(
            Repository(settings.model_repository),
            self.executor,
            self.caches,
            settings.expose_model_names,
            settings.llm_memory_mib,
        )
        self.metrics = Metrics(
            self.prometheus_registry, lambda: (rt.stats for rt in self.registry.all_ready())
        )
        # OpenTelemetry traces (off unless an OTLP endpoint is set): the data plane that
        # records spans, the HTTP app and gRPC's ModelInfer wrapped; nothing otherwise
        t = settings.tracing
        traces = t.traces_url()
        self.tracing = Tracing(traces, t.service_name, t.export_timeout_s, t.sample_ratio) if traces else None
        control = settings.model_control_mode == "explicit"
        self.dataplane = (
            DataPlane(self.registry, control, settings.strict_readiness)
            if self.tracing is None
            else TracedDataPlane(self.tracing, self.registry, control, settings.strict_readiness)
        )
        a = settings.auth
        self.auth = Auth(a.token.get_secret_value() if a.token else None, a.protect_health, a.protect_metrics)
        self.worker = worker
        token = a.token.get_secret_value() if a.token else None
        self.peers = Peers(worker.index, list(worker.peer_ports), token) if worker is not None else None
        if self.peers is not None:
            self.dataplane.siblings = self.peers.statistics
        m = settings.shared_memory
        self.shared_memory = SharedMemoryService(
            m.mode == "system", m.key_prefix, m.max_regions_per_client, m.max_bytes_per_client
        )
        if self.shared_memory.enabled:
            self.dataplane.extensions.append("system_shared_memory")
        e = settings.edge
        self.edge_files = (
            EdgeFiles(e.dir, e.immutable_max_age_s, self.executor.offload) if e.dir is not None else None
        )
        # the HTTP listeners (the public port, the metrics port, a worker's private port),
        # each with the grace its requests get at the stop
        self._http: list[tuple[HttpServer, float | None]] = []
        self._grpc: Any = None
        self._grpc_sock: socket.socket | None = None  # the native stack's listening socket
        self._grpc_calls = CallCount()
        self._poll: asyncio.Task[None] | None = None  # --model-control-mode poll
        wire = settings.http.wire_timing_file  # a benchmark's witness (server/wire_timing.py)
        self._wire = WireLog(wire) if wire is not None else None

    async def local_metrics(self) -> bytes:
        return generate_latest(self.prometheus_registry)

    async def metrics_text(self) -> bytes:
        """This server's metrics; with ``--workers``, every worker's under a ``worker`` label."""
        local = await self.local_metrics()
        return local if self.peers is None else await self.peers.metrics(local)

    def http_app(self, local: bool = False) -> HttpApp:
        """The ASGI application of this server (to mount elsewhere, or test in-process).
        ``local``: a worker's private listener, answering for this process only."""
        metrics = (
            (self.local_metrics if local else self.metrics_text) if self.settings.metrics.enabled else None
        )
        h = self.settings.http
        app = HttpApp(
            self.dataplane,
            h.max_request_bytes,
            self.auth,
            self.executor.offload,
            metrics,
            h.max_json_bytes,
            self.edge_files,
            local_only=local,
            shared_memory=self.shared_memory,
        )
        app.generate.configure_streams(h.stream_write_timeout_s, h.stream_buffer_bytes)
        return app

    async def _listen(
        self,
        app: Any,
        limits: ConnectionLimits,
        sock: socket.socket,
        what: str,
        graceful_s: float,
        wire: WireLog | None = None,
        express: Express | None = None,
    ) -> None:
        """Serve ``app`` on ``sock`` (bound by ``_bind`` or inherited from the parent of
        ``--workers``) with ``limits``; ``graceful_s``: how long its requests in flight get
        at the stop (0: no bound); ``express``: its express lane (``HttpApp.express``)."""
        protocol = timed_protocol(HttpProtocol, wire) if wire is not None else HttpProtocol
        server = HttpServer(app, limits, protocol, what, express)
        await server.start(sock)
        self._http.append((server, graceful_s or None))

    def _bind(self) -> tuple[socket.socket | None, socket.socket | None, int | None]:
        """Bind every port before anything starts: the HTTP and metrics sockets, and the
        gRPC server's port. A port that cannot be had is a ConfigError naming it."""
        s, w = self.settings, self.worker
        socks: list[socket.socket] = []
        try:
            if w is not None:  # bound by the parent of --workers N
                http = inherited(w.http_fd) if w.http_fd is not None else None
                metrics = inherited(w.metrics_fd) if w.metrics_fd is not None else None
            else:
                http = bind_tcp(s.host, s.http.port, HTTP) if s.http.enabled else None
                socks += [http] if http else []
                metrics = bind_tcp(s.host, s.metrics.port, METRICS) if s.metrics.enabled else None
                socks += [metrics] if metrics else []
            grpc_port = None
            if s.grpc.enabled:
                port = w.grpc_port if w is not None and w.grpc_port is not None else s.grpc.port
                if s.grpc.stack == "native":
                    self._grpc_sock = bind_tcp(s.host, port, GRPC, shared=w is not None)
                    socks.append(self._grpc_sock)
                    grpc_port = self._grpc_sock.getsockname()[1]
                    self._grpc = self._native_grpc()
                else:
                    options = server_options(s.grpc, shared=w is not None)
                    self._grpc = build_grpc_server(
                        self.dataplane,
                        s.grpc.max_message_bytes,
                        self.auth,
                        options,
                        self._grpc_calls,
                        self.shared_memory,
                    )
                    grpc_port = bind_grpc(self._grpc, s.host, port, shared=w is not None)
        except BaseException:
            self._grpc = self._grpc_sock = None
            for sock in socks:
                sock.close()
            raise
        return http, metrics, grpc_port

    def _native_grpc(self) -> NativeGrpcServer:
        g = self.settings.grpc
        limits = Http2Limits(
            max_concurrent_streams=g.max_concurrent_streams,
            max_header_list_bytes=g.max_metadata_bytes,
            max_message_bytes=g.max_message_bytes,
            max_resets_per_s=g.max_resets_per_s,
            max_control_frames_per_s=g.max_control_frames_per_s,
            min_ping_interval_s=g.min_ping_interval_s,
            max_ping_strikes=g.max_ping_strikes,
            max_unread_bytes=g.max_unread_bytes,
            max_buffered_bytes=max(g.max_buffered_bytes, g.max_message_bytes + 5),
            unread_timeout_s=g.unread_timeout_s,
            handshake_timeout_s=g.handshake_timeout_s,
            idle_timeout_s=g.idle_timeout_s,
            keepalive_time_s=g.keepalive_time_s,
            keepalive_timeout_s=g.keepalive_timeout_s,
            max_connection_age_s=g.max_connection_age_s,
            connection_age_grace_s=g.connection_age_grace_s,
            request_timeout_s=g.request_timeout_s,
        )
        server = NativeGrpcServer(
            self.dataplane,
            limits,
            self.executor.offload,
            self.auth,
            self._grpc_calls,
            g.max_connections,
            g.max_connections_per_peer,
            self.shared_memory,
        )
        self.prometheus_registry.register(GrpcListenerCollector(server.figures))
        return server

    async def start(self) -> None:
        """Open the ports, then load the models (health/live answers while they load)."""
        s = self.settings
        http_sock, metrics_sock, grpc_port = self._bind()
        h = s.http
        limits = ConnectionLimits(
            h.max_header_bytes, h.header_timeout_s, h.body_timeout_s, h.keep_alive_s, h.max_connections
        )
        w = self.worker
        if w is not None:  # the private port first: siblings ask it for metrics and statistics
            peer_limits = replace(limits, max_connections=METRICS_MAX_CONNECTIONS)
            await self._listen(self.http_app(local=True), peer_limits, inherited(w.peer_fd), "peer", 1)
            if not w.accept_early:  # join the shared ports only once warm
                await self._load()
        if http_sock is not None:
            app: HttpApp | TracedHttp = self.http_app()
            if self.tracing is not None:
                app = self.tracing.http(app)
            if self._wire is not None:
                self._wire.start()
            await self._listen(app, limits, http_sock, "http", s.shutdown_grace_s, self._wire, app.express)
        if isinstance(self._grpc, NativeGrpcServer):
            assert self._grpc_sock is not None
            await self._grpc.start(self._grpc_sock)
        elif self._grpc is not None:
            await self._grpc.start()
        if metrics_sock is not None:
            metrics_app = MetricsApp(self.metrics_text)
            metrics_limits = replace(limits, max_connections=min(h.max_connections, METRICS_MAX_CONNECTIONS))
            await self._listen(metrics_app, metrics_limits, metrics_sock, "metrics", 1)
        log.info(
            "listening on %s: http %s, grpc %s, metrics %s",
            s.host,
            http_sock.getsockname()[1] if http_sock else "off",
            grpc_port or "off",
            metrics_sock.getsockname()[1] if metrics_sock else "off",
        )
        if self.edge_files is not None and http_sock is not None:
            port = http_sock.getsockname()[1]
            for name in self.edge_files.bundles():
                log.info("edge bundle %s: http://%s:%s/edge/%s/", name, s.host, port, name)
        # after the listeners: gRPC's own threads keep every CPU, only the loop thread is placed
        self.executor.pin_event_loop()
        if w is None or w.accept_early:
            await self._load()
        if w is not None and w.ready_fd is not None:
            os.write(w.ready_fd, b"R")  # tell the parent this worker serves
            os.close(w.ready_fd)

    async def start_embedded(self) -> None:
        """Load the models without opening any port: another server (Ray Serve's proxy, an
        ASGI host) calls ``http_app()``. Returns once every model is loaded and warm."""
        await self._load()

    async def _load(self) -> None:
        s = self.settings
        if s.model_control_mode in ("none", "poll"):
            await self.registry.load_all()
        elif s.load_models:
            names = None if "*" in s.load_models else s.load_models
            await self.registry.load_all(names)
        if s.model_control_mode == "poll" and self._poll is None:
            poller = RepositoryPoller(self.registry, s.repository_poll_s, self.executor.run_load)
            await poller.start()
            self._poll = asyncio.create_task(poller.run(), name="repository-poll")
        self.dataplane.started = True
        log.info(
            "ready: %s",
            [f"{r['name']}:{r.get('version', '-')}:{r.get('state')}" for r in self.registry.index()],
        )

    async def stop(self) -> None:
        """Stop accepting, finish what is in flight, release everything."""
        self.dataplane.stopping = True
        grace = self.settings.shutdown_grace_s
        waits = []
        for server, grace_s in self._http:
            waits.append(asyncio.ensure_future(server.stop(grace_s)))
        if isinstance(self._grpc, NativeGrpcServer):
            waits.append(asyncio.ensure_future(self._grpc.stop(grace)))
        elif self._grpc is not None:
            waits.append(asyncio.ensure_future(self._stop_grpc(grace)))
        for failed in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(failed, BaseException):  # logged: the drain may have cut calls short
                log.error("stopping a listener failed: %r", failed, exc_info=failed)
        if self._wire is not None:
            self._wire.close()
        if self._poll is not None:
            self._poll.cancel()
            await asyncio.gather(self._poll, return_exceptions=True)
        await self.registry.close()
        self.shared_memory.close()
        await self.caches.close()
        if self.tracing is not None:  # export the spans still pending (blocking: off the loop)
            await self.executor.offload(self.tracing.shutdown)
        self.executor.shutdown()
        self.executor.unpin_event_loop()
        log.info("stopped")

    async def _stop_grpc(self, grace: float, quiet_s: float = 0.2, settle_cap_s: float = 2.0) -> None:
        """(grpcio stack) grpc.aio's stop cancels the calls it has received but not yet handed to the service:
        calls a client sent just before the signal. So first keep serving until no new call
        has started for ``quiet_s`` (at most ``settle_cap_s``), then stop with the grace."""
        loop = asyncio.get_running_loop()
        end = loop.time() + min(grace, settle_cap_s)
        seen, quiet_since = self._grpc_calls.started, loop.time()
        while loop.time() < end:
            await asyncio.sleep(0.02)
            if self._grpc_calls.started != seen:
                seen, quiet_since = self._grpc_calls.started, loop.time()
            elif loop.time() - quiet_since >= quiet_s:
                break
        await self._grpc.stop(grace)

    async def run_until_signal(self) -> None:
        """Start, wait for SIGTERM or SIGINT, stop gracefully."""
        loop = asyncio.get_running_loop()
        got_signal = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, got_signal.set)
        await self.start()
        if self.settings.model_control_mode == "none":
            # what loading made (sessions, tokenizers, pipelines: most of the heap) lives as
            # long as the process: out of the collector's way, a full collection walks only
            # what requests made. It walked everything, 50-70 ms with the example repository,
            # and every client waited that long (issue 24, item 5). Not with model control:
            # a model unloaded must be collectable.
            gc.collect()
            gc.freeze()
        await got_signal.wait()
        log.info("signal received: draining in-flight requests")
        await self.stop()


def serve(settings: Settings) -> int:
    """Run a server until SIGTERM/SIGINT (blocking): in this process, or in
    ``settings.workers`` worker processes under this one. Returns the exit code."""
    if settings.workers > 1:
        from milliserve.server.workers import serve_workers

        return serve_workers(settings)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        runner = asyncio.run
    runner(Server(settings).run_until_signal())
    return 0
