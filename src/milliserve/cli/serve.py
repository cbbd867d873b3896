"""``milliserve serve``'s flags as settings: merged into the environment's settings and
validated once, together, so that a wrong value stops the start naming the flag (or the
variable) it came from."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["UsageError", "parse_bool", "serve_settings"]


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
}


def serve_settings(args: argparse.Namespace) -> Any:
    """Settings from the environment with the flags given on top, validated once, together.
    Raises UsageError naming the flag (or variable) and the value."""
    from pydantic import ValidationError

    from milliserve.config.settings import Settings

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
