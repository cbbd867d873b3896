"""Server settings: one nested tree, read from the environment (prefix ``MILLISERVE_``,
nesting with ``__``, e.g. ``MILLISERVE_HTTP__PORT=9000``) and overridden by CLI flags.

This is the only module that reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["GrpcSettings", "HttpSettings", "MetricsSettings", "Settings", "hf_offline_env"]

MiB = 1024 * 1024


class HttpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    port: int = Field(8000, ge=0, le=65535)
    max_request_bytes: int = Field(32 * MiB, ge=1024)


class GrpcSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    port: int = Field(8001, ge=0, le=65535)
    max_message_bytes: int = Field(32 * MiB, ge=1024)


class MetricsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    port: int = Field(8002, ge=0, le=65535)


class RedisSettings(BaseModel):
    """Redis for response caches with ``backend: redis`` (and, later, feature stores)."""

    url: str = "redis://127.0.0.1:6379/0"
    # every Redis call is bounded by this; a slower Redis is bypassed, never waited on
    timeout_ms: float = Field(5.0, gt=0)
    # after a failure Redis is left alone this long before it is tried again
    backoff_s: float = Field(1.0, ge=0)


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
    model_control_mode: Literal["none", "explicit"] = "none"
    # Models to load at start in explicit mode ("*" = all), as Triton's --load-model.
    load_models: list[str] = []
    log_level: str = "INFO"
    # Seconds to finish in-flight requests after SIGTERM before giving up.
    shutdown_grace_s: float = Field(30.0, ge=0)
    # "auto": keep the event loop on one CPU and run microsecond models' workers beside it
    # (Linux); "off": leave thread placement to the OS.
    cpu_affinity: Literal["auto", "off"] = "auto"


def hf_offline_env() -> dict[str, str]:
    """Environment for code that touches Hugging Face libraries: never reach a model hub."""
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env
