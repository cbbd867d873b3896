"""``milliserve ray serve REPO``: deploy milliserve replicas on a running Ray cluster."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_ray_parser"]


def _ray_serve(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console

    from milliserve.config.settings import ray_env
    from milliserve.integrations.ray import milliserve_app

    os.environ.update(ray_env())  # loopback only, no usage stats (docs/deploy.md)
    import ray
    from ray import serve

    console = Console(stderr=True)
    ray.init(address=args.address, namespace="serve", log_to_driver=False)
    _past_proxy_restarts(
        console, lambda: serve.start(http_options={"host": args.host, "port": args.http_port})
    )
    app = milliserve_app(
        args.repository,
        name=args.name,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_ongoing_requests=args.target_ongoing_requests,
        num_cpus=args.num_cpus,
        upscale_delay_s=args.upscale_delay_s,
        downscale_delay_s=args.downscale_delay_s,
    )
    with console.status(f"deploying {args.name}: {args.min_replicas} warm replica(s) loading their models"):
        _past_proxy_restarts(
            console, lambda: serve.run(app, name=args.name, route_prefix="/", blocking=False)
        )
    console.print(
        f"[green]serving[/green] {args.repository} as Ray Serve app {args.name!r} at "
        f"http://{args.host}:{args.http_port}/v2 ({args.min_replicas}-{args.max_replicas} replicas)"
    )
    if args.detach:
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    console.print(f"deleting {args.name}: replicas finish what they hold")
    serve.delete(args.name)
    return 0


def _past_proxy_restarts(console: Any, call: Callable[[], object], tries: int = 5) -> None:
    """``call``, again when Ray Serve killed its HTTP proxy while it started: on a busy node a
    proxy that is not up within Serve's ready check (5 s) is killed and replaced, and the
    call that waited for it fails with ActorDiedError although the next proxy will serve."""
    from ray.exceptions import ActorDiedError

    for attempt in range(1, tries + 1):
        try:
            call()
            return
        except ActorDiedError as exc:
            if "ProxyActor" not in str(exc) or attempt == tries:
                raise
            console.print(
                f"[yellow]Ray Serve replaced its HTTP proxy, which was slow to start (a busy node); "
                f"trying again ({attempt}/{tries - 1})[/yellow]"
            )


def add_ray_parser(sub: Any) -> None:
    r = sub.add_parser("ray", help="run milliserve replicas on Ray Serve (a warm pool, autoscaled)")
    rsub = r.add_subparsers(dest="ray_command", required=True)
    s = rsub.add_parser("serve", help="deploy REPO on a running Ray cluster, OIP over HTTP via Serve's proxy")
    s.add_argument("repository", type=Path, metavar="REPO", help="a model repository every node can read")
    s.add_argument("--address", default="auto", help="the Ray cluster (default auto: the local one)")
    s.add_argument("--host", default="127.0.0.1", help="Serve's HTTP proxy address (default 127.0.0.1)")
    s.add_argument("--http-port", type=int, default=8000, help="Serve's HTTP proxy port (default 8000)")
    s.add_argument("--name", default="milliserve", help="the Serve application and deployment name")
    s.add_argument("--min-replicas", type=int, default=1, help="the warm pool (default 1)")
    s.add_argument("--max-replicas", type=int, default=2)
    s.add_argument(
        "--target-ongoing-requests", type=float, default=4.0, help="per replica, drives autoscaling"
    )
    s.add_argument("--num-cpus", type=float, default=0.5, help="CPUs reserved per replica (default 0.5)")
    s.add_argument("--upscale-delay-s", type=float, default=2.0)
    s.add_argument("--downscale-delay-s", type=float, default=60.0)
    s.add_argument(
        "--detach",
        action="store_true",
        help="return once deployed (default: stay, delete the app on SIGTERM)",
    )
    s.set_defaults(func=_ray_serve)
