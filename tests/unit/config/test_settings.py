"""Server settings: safe defaults, environment overrides, unknown keys rejected."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from milliserve.config.settings import Settings


def test_defaults_are_safe() -> None:
    s = Settings()
    assert s.host == "127.0.0.1"
    assert s.model_control_mode == "none"
    assert (s.http.port, s.grpc.port, s.metrics.port) == (8000, 8001, 8002)
    assert s.http.max_request_bytes == 32 * 1024 * 1024


def test_environment_overrides_nested_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILLISERVE_HTTP__PORT", "9100")
    monkeypatch.setenv("MILLISERVE_GRPC__ENABLED", "false")
    monkeypatch.setenv("MILLISERVE_MODEL_CONTROL_MODE", "explicit")
    s = Settings()
    assert s.http.port == 9100 and not s.grpc.enabled and s.model_control_mode == "explicit"


def test_wrong_values_are_rejected() -> None:
    with pytest.raises(ValidationError, match="model_control_mode"):
        Settings(model_control_mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="unknown_setting"):
        Settings(unknown_setting=1)  # type: ignore[call-arg]
