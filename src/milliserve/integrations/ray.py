"""milliserve replicas as a Ray Serve application: a warm pool that Ray places, scales and
replaces, with the Open Inference Protocol over HTTP through Ray Serve's proxy.

    from milliserve.integrations.ray import milliserve_app
    serve.run(milliserve_app("/models", min_replicas=2, max_replicas=8), route_prefix="/")

or ``milliserve ray serve REPO --address HOST:PORT``. Each replica holds a whole milliserve
(registry, batchers, caches) without ports of its own: Ray's proxy hands it HTTP requests as
ASGI calls, answered by the same code as ``milliserve serve``'s HTTP port, so tritonclient,
perf_analyzer and curl work unchanged (docs/deploy.md says why the proxy rather than the
replicas' own ports).

- **Warm before traffic:** a replica loads and warms its models during ASGI lifespan
  startup, which Ray Serve awaits before it routes anything to the replica.
- **Autoscaling on ongoing requests:** ``min_replicas`` is the warm pool, never scaled
  away; ``target_ongoing_requests`` per replica drives scale-up after ``upscale_delay_s``.
- **Graceful shutdown:** Ray stops routing to a replica, waits for what it holds
  (``graceful_shutdown_timeout_s``), then the lifespan shutdown stops the replica's server.
- Each response names its replica (``x-milliserve-replica: <pid>``), when it became warm
  (``x-milliserve-replica-warm-at``, seconds since the epoch) and its cold start
  (``x-milliserve-replica-cold-start-s``: from the replica's construction to its models
  warm), which is also logged.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from milliserve.errors import MissingDependencyError

__all__ = ["ReplicaApp", "milliserve_app"]

log = logging.getLogger(__name__)


class ReplicaApp:
    """One replica's ASGI application: a milliserve without ports, warm at lifespan startup."""

    def __init__(self, repository: str, overrides: dict[str, Any] | None = None) -> None:
        from milliserve.config.settings import Settings
        from milliserve.server.assembly import Server

        settings = Settings(
            model_repository=Path(repository),
            cpu_affinity="off",  # the loop is Ray's: leave thread placement to the OS
            **(overrides or {}),
        )
        self.created = time.time()
        self.server = Server(settings)
        self.http = self.server.http_app()
        self._pid = str(os.getpid()).encode()
        self._warm: list[tuple[bytes, bytes]] = []

    def ready(self) -> bool:
        return self.server.dataplane.ready()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        pid = self._pid

        async def send_named(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-milliserve-replica", pid), *self._warm]
                message = {**message, "headers": headers}
            await send(message)

        await self.http(scope, receive, send_named)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.server.start_embedded()
                    if not self.ready():  # say why, where Ray's deploy error shows it
                        failed = [
                            f"{r['name']}: {r.get('reason') or r.get('state')}"
                            for r in self.server.registry.index()
                            if r.get("state") != "READY"
                        ]
                        raise RuntimeError(f"models not ready: {'; '.join(failed)}")
                except Exception as exc:
                    log.exception("replica %s could not load its models", os.getpid())
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                warm_at = time.time()
                cold = warm_at - self.created
                self._warm = [
                    (b"x-milliserve-replica-warm-at", f"{warm_at:.3f}".encode()),
                    (b"x-milliserve-replica-cold-start-s", f"{cold:.3f}".encode()),
                ]
                log.info("replica %s warm %.2f s after it was created", os.getpid(), cold)
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.server.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def milliserve_app(
    repository: str | Path,
    *,
    name: str = "milliserve",
    min_replicas: int = 1,
    max_replicas: int = 2,
    target_ongoing_requests: float = 4.0,
    max_ongoing_requests: int = 64,
    upscale_delay_s: float = 2.0,
    downscale_delay_s: float = 60.0,
    num_cpus: float = 0.5,
    graceful_shutdown_timeout_s: float = 20.0,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """A Ray Serve Application of milliserve replicas serving ``repository`` (a path every
    Ray node can read). ``overrides``: milliserve settings for the replicas."""
    try:
        from ray import serve
    except ImportError:
        raise MissingDependencyError("Ray Serve is not installed: pip install 'milliserve[ray]'") from None

    repo = str(Path(repository).resolve())

    def build() -> ReplicaApp:  # runs on each replica
        return ReplicaApp(repo, overrides)

    @serve.ingress(build)
    class MilliserveReplica:
        def check_health(self) -> None:
            app = self._asgi_app  # type: ignore[attr-defined]
            if not app.ready():
                raise RuntimeError("milliserve replica not ready (a model failed or is reloading)")

    deployment = serve.deployment(
        name=name,
        autoscaling_config={
            "min_replicas": min_replicas,
            "initial_replicas": min_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target_ongoing_requests,
            "upscale_delay_s": upscale_delay_s,
            "downscale_delay_s": downscale_delay_s,
        },
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus},
        graceful_shutdown_timeout_s=graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=5.0,
    )(MilliserveReplica)
    return deployment.bind()
