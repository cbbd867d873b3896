"""Build a server from Settings; start and stop HTTP, gRPC and metrics together.

Shutdown order (SIGTERM or Ctrl-C): report not-ready, stop accepting new
connections, let in-flight HTTP requests and gRPC calls finish (up to
``shutdown_grace_s``), drain every batcher, release the models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from milliserve.cache.response_cache import CacheFactory
from milliserve.config.settings import Settings
from milliserve.errors import ConfigError
from milliserve.observability.metrics import Metrics
from milliserve.repository.registry import ModelRegistry
from milliserve.repository.repository import Repository
from milliserve.runtime.dataplane import DataPlane
from milliserve.runtime.executor import Executor
from milliserve.server.grpc.servicer import build_grpc_server
from milliserve.server.http.app import HttpApp
from milliserve.server.metrics_app import MetricsApp

__all__ = ["Server", "serve"]

log = logging.getLogger(__name__)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the Server owns signals and shutdown order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Server:
    """A running milliserve: ``await start()``, then ``await stop()``."""

    def __init__(self, settings: Settings, prometheus_registry: CollectorRegistry | None = None) -> None:
        if settings.model_repository is None:
            raise ConfigError("no model repository given (milliserve serve MODEL_REPOSITORY)")
        self.settings = settings
        self.prometheus_registry = prometheus_registry or CollectorRegistry()
        self.executor = Executor(cpu_affinity=settings.cpu_affinity == "auto")
        redis = settings.redis
        self.caches = CacheFactory(redis.url, redis.timeout_ms / 1000, redis.backoff_s)
        self.registry = ModelRegistry(Repository(settings.model_repository), self.executor, self.caches)
        self.metrics = Metrics(
            self.prometheus_registry, lambda: (rt.stats for rt in self.registry.all_ready())
        )
        self.dataplane = DataPlane(self.registry, model_control=settings.model_control_mode == "explicit")
        self._uvicorns: list[tuple[_Uvicorn, asyncio.Task[None]]] = []
        self._grpc: Any = None

    def http_app(self) -> HttpApp:
        """The ASGI application of this server (to mount elsewhere, or test in-process)."""
        return HttpApp(self.dataplane, self.settings.http.max_request_bytes)

    def _uvicorn(self, app: Any, port: int, graceful_s: float) -> _Uvicorn:
        config = uvicorn.Config(
            app,
            host=self.settings.host,
            port=port,
            http="httptools",
            lifespan="off",
            access_log=False,
            log_config=None,
            timeout_graceful_shutdown=int(graceful_s) or None,
            server_header=False,
            date_header=False,
        )
        return _Uvicorn(config)

    async def _start_uvicorn(self, server: _Uvicorn, what: str) -> None:
        task = asyncio.create_task(server.serve(), name=f"uvicorn-{what}")
        while not server.started:
            if task.done():
                task.result()  # re-raise the bind error
                raise ConfigError(f"{what} server could not start on port {server.config.port}")
            await asyncio.sleep(0.01)
        self._uvicorns.append((server, task))

    async def start(self) -> None:
        """Open the ports, then load the models (health/live answers while they load)."""
        s = self.settings
        if s.http.enabled:
            await self._start_uvicorn(self._uvicorn(self.http_app(), s.http.port, s.shutdown_grace_s), "http")
        if s.grpc.enabled:
            self._grpc = build_grpc_server(self.dataplane, s.grpc.max_message_bytes)
            self._grpc.add_insecure_port(f"{s.host}:{s.grpc.port}")
            await self._grpc.start()
        if s.metrics.enabled:
            metrics_app = MetricsApp(self.prometheus_registry)
            await self._start_uvicorn(self._uvicorn(metrics_app, s.metrics.port, 1), "metrics")
        log.info(
            "listening on %s: http %s, grpc %s, metrics %s",
            s.host,
            s.http.port if s.http.enabled else "off",
            s.grpc.port if s.grpc.enabled else "off",
            s.metrics.port if s.metrics.enabled else "off",
        )
        # after the listeners: gRPC's own threads keep every CPU, only the loop thread is placed
        self.executor.pin_event_loop()
        if s.model_control_mode == "none":
            await self.registry.load_all()
        elif s.load_models:
            names = None if "*" in s.load_models else s.load_models
            await self.registry.load_all(names)
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
        for server, task in self._uvicorns:
            server.should_exit = True
            waits.append(task)
        if self._grpc is not None:
            waits.append(asyncio.ensure_future(self._grpc.stop(grace)))
        await asyncio.gather(*waits, return_exceptions=True)
        await self.registry.close()
        await self.caches.close()
        self.executor.shutdown()
        self.executor.unpin_event_loop()
        log.info("stopped")

    async def run_until_signal(self) -> None:
        """Start, wait for SIGTERM or SIGINT, stop gracefully."""
        loop = asyncio.get_running_loop()
        got_signal = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, got_signal.set)
        await self.start()
        await got_signal.wait()
        log.info("signal received: draining in-flight requests")
        await self.stop()


def serve(settings: Settings) -> None:
    """Run a server in this process until SIGTERM/SIGINT (blocking)."""
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        runner = asyncio.run
    runner(Server(settings).run_until_signal())
