"""``milliserve serve``: its flags, and the flags as settings: merged into the environment's
settings and validated once, together, so that a wrong value stops the start naming the flag
(or the variable) it came from."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["UsageError", "add_serve_parser", "parse_bool", "serve_settings"]


class UsageError(Exception):
    """Bad command-line arguments (exit code 2)."""


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value in ("true", "1", "yes")


# flag -> where it lands in Settings (a validation error names the flag the user typed)
_SERVE_FLAGS: dict[str, tuple[str, ...]] = {
    "model_repository": ("model_repository",),
    "host": ("host",),
    "http_port": ("http", "port"),
    "grpc_port": ("grpc", "port"),
    "metrics_port": ("metrics", "port"),
    "model_control_mode": ("model_control_mode",),
    "load_model": ("load_models",),
    "repository_poll_secs": ("repository_poll_s",),
    "shared_memory": ("shared_memory", "mode"),
    "shared_memory_key_prefix": ("shared_memory", "key_prefix"),
    "log_level": ("log_level",),
    "redis_url": ("redis", "url"),
    "auth_token": ("auth", "token"),
    "strict_readiness": ("strict_readiness",),
    "edge": ("edge", "dir"),
    "workers": ("workers",),
    "otlp_endpoint": ("tracing", "otlp_endpoint"),
    "trace_sample_ratio": ("tracing", "sample_ratio"),
    "llm_memory_mib": ("llm_memory_mib",),
}


def serve_settings(args: argparse.Namespace) -> Any:
    """Settings from the environment with the flags given on top, validated once, together.
    Raises UsageError naming the flag (or variable) and the value."""
    from pydantic import ValidationError

    from milliserve.config.settings import Settings

    given = args.model_repository_flag  # tritonserver's spelling of MODEL_REPOSITORY
    if given is not None and args.model_repository not in (None, given):
        raise UsageError(
            f"two model repositories: {str(args.model_repository)!r} and --model-repository "
            f"{str(given)!r}; give one"
        )
    args.model_repository = args.model_repository or given
    overrides: dict[str, Any] = {}
    for flag, path in _SERVE_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        node = overrides
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    if args.max_request_bytes is not None:  # one limit for both front ends
        overrides.setdefault("http", {})["max_request_bytes"] = args.max_request_bytes
        overrides.setdefault("grpc", {})["max_message_bytes"] = args.max_request_bytes
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        # a value the user typed is named by its flag; anything else came from the environment
        by_path = {path: flag for flag, path in _SERVE_FLAGS.items() if getattr(args, flag, None) is not None}
        if args.max_request_bytes is not None:
            by_path[("http", "max_request_bytes")] = by_path[("grpc", "max_message_bytes")] = (
                "max_request_bytes"
            )
        lines = []
        for err in exc.errors():
            loc = tuple(str(p) for p in err["loc"])
            given = by_path.get(loc)
            where = f"--{given.replace('_', '-')}" if given else "MILLISERVE_" + "__".join(loc).upper()
            lines.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
        raise UsageError("; ".join(dict.fromkeys(lines))) from None
    if settings.model_repository is None:
        raise UsageError("no model repository: give MODEL_REPOSITORY or set MILLISERVE_MODEL_REPOSITORY")
    return settings


def _serve(args: argparse.Namespace) -> int:
    from milliserve.observability.logs import configure_logging
    from milliserve.server.assembly import serve

    settings = serve_settings(args)
    configure_logging(settings.log_level)
    return serve(settings)


def add_serve_parser(sub: Any) -> None:
    """``serve``."""
    s = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    s.add_argument(
        "model_repository",
        type=Path,
        nargs="?",
        default=None,
        metavar="MODEL_REPOSITORY",
        help="the model repository (default: $MILLISERVE_MODEL_REPOSITORY)",
    )
    s.add_argument(
        "--model-repository",
        dest="model_repository_flag",
        type=Path,
        default=None,
        metavar="DIR",
        help="MODEL_REPOSITORY, as tritonserver spells it",
    )
    s.add_argument("--http-port", type=int, default=None, help="default 8000")
    s.add_argument("--grpc-port", type=int, default=None, help="default 8001")
    s.add_argument("--metrics-port", type=int, default=None, help="default 8002")
    s.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        default=None,
        help="none: load every model at start (default); poll: and follow the repository's "
        "changes; explicit: the repository load/unload API decides (as Triton)",
    )
    s.add_argument(
        "--repository-poll-secs",
        type=float,
        default=None,
        metavar="S",
        help="in poll mode, how often the repository is read for changes (default 15)",
    )
    s.add_argument(
        "--shared-memory",
        choices=("off", "system"),
        default=None,
        help="system: Triton's system shared-memory extension for clients on this machine (default off)",
    )
    s.add_argument(
        "--shared-memory-key-prefix",
        default=None,
        metavar="PREFIX",
        help="shared-memory keys clients may register must start with PREFIX, e.g. /myapp_ (default: any)",
    )
    s.add_argument(
        "--load-model",
        action="append",
        metavar="NAME",
        help="in explicit mode, load NAME at start ('*' for all); repeatable",
    )
    s.add_argument("--max-request-bytes", type=int, default=None, help="request body limit (default 32 MiB)")
    s.add_argument("--log-level", default=None)
    s.add_argument(
        "--redis-url",
        default=None,
        help="Redis for response caches with backend redis (default redis://127.0.0.1:6379/0)",
    )
    s.add_argument(
        "--auth-token",
        default=None,
        help="require this token (Authorization: Bearer, or x-api-key) on inference, metadata and "
        "repository calls; health and metrics stay open (env MILLISERVE_AUTH__TOKEN)",
    )
    s.add_argument(
        "--strict-readiness",
        type=parse_bool,
        default=None,
        metavar="true|false",
        help="ready only while every model that should serve does (default true, as Triton)",
    )
    s.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="N processes sharing the ports, each with its own models (default 1; docs/deploy.md)",
    )
    s.add_argument(
        "--edge",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve the browser bundles in DIR (milliserve edge build) at /edge/<model>/ (default off)",
    )
    s.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="export OpenTelemetry traces per stage over OTLP/HTTP to URL (a collector's base URL, "
        "as OTEL_EXPORTER_OTLP_ENDPOINT; default off)",
    )
    s.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=None,
        metavar="R",
        help="with --otlp-endpoint: the share of requests traced that bring no traceparent "
        "(default 0.01; a caller's sampled flag is always followed; OTEL_TRACES_SAMPLER replaces it)",
    )
    s.add_argument(
        "--llm-memory-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="load generative (GGUF) models on their first request and unload idle ones, least "
        "recently used first, to keep their measured resident memory under MIB (default 0: "
        "every model loads at start)",
    )
    s.set_defaults(func=_serve)
