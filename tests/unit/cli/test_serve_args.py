"""``milliserve serve``'s flags are merged into the settings before they are validated, once:
a bad value is a usage error (exit 2) naming the flag, never a server that starts with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from milliserve.cli.main import build_parser, main
from milliserve.cli.serve import UsageError, serve_settings


def settings(*argv: str) -> object:
    return serve_settings(build_parser().parse_args(["serve", *argv]))


def test_flags_land_in_the_settings(tmp_path: Path) -> None:
    s: object = settings(
        str(tmp_path), "--http-port", "9000", "--grpc-port", "0", "--max-request-bytes", "2048",
        "--auth-token", "t", "--strict-readiness", "false", "--redis-url", "redis://127.0.0.1:1/0",
    )  # fmt: skip
    assert s.http.port == 9000 and s.grpc.port == 0  # type: ignore[attr-defined]
    assert s.http.max_request_bytes == s.grpc.max_message_bytes == 2048  # type: ignore[attr-defined]
    assert s.auth.token.get_secret_value() == "t" and not s.strict_readiness  # type: ignore[attr-defined]
    assert s.redis.url == "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--http-port", "99999"], r"--http-port: Input should be less than or equal to 65535 \(got 99999\)"),
        (["--max-request-bytes", "1"], r"--max-request-bytes: Input should be greater than or equal to 1024"),
        (["--metrics-port", "-1"], r"--metrics-port"),
        (["--auth-token", " "], r"--auth-token: .*the auth token is empty"),
    ],
)
def test_bad_values_name_the_flag(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        settings(str(tmp_path), *argv)


def test_the_repository_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UsageError, match="no model repository: give MODEL_REPOSITORY or set MILLISERVE_"):
        settings()
    monkeypatch.setenv("MILLISERVE_MODEL_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("MILLISERVE_HTTP__PORT", "9100")
    s: object = settings("--grpc-port", "9101")
    assert s.model_repository == tmp_path and s.http.port == 9100  # type: ignore[attr-defined]
    assert settings("--http-port", "9200").http.port == 9200  # type: ignore[attr-defined]  # flag over env
    monkeypatch.setenv("MILLISERVE_GRPC__PORT", "70000")
    with pytest.raises(
        UsageError, match="MILLISERVE_GRPC__PORT: Input should be less than or equal to 65535"
    ):
        settings()


def test_a_usage_error_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(tmp_path), "--http-port", "99999"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("milliserve serve: error: --http-port") and "Traceback" not in err


def test_triton_extension_flags(tmp_path: Path) -> None:
    s: object = settings(
        str(tmp_path), "--model-control-mode", "poll", "--repository-poll-secs", "2.5",
        "--shared-memory", "system", "--shared-memory-key-prefix", "/app_",
    )  # fmt: skip
    assert s.model_control_mode == "poll" and s.repository_poll_s == 2.5  # type: ignore[attr-defined]
    assert s.shared_memory.mode == "system" and s.shared_memory.key_prefix == "/app_"  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=r"--shared-memory-key-prefix: .*not the start of a POSIX"):
        settings(str(tmp_path), "--shared-memory-key-prefix", "app/")
    with pytest.raises(UsageError, match="--repository-poll-secs"):
        settings(str(tmp_path), "--repository-poll-secs", "0")


def test_the_repository_may_be_given_as_tritonserver_spells_it(tmp_path: Path) -> None:
    s: object = settings(f"--model-repository={tmp_path}", "--http-port", "9300")
    assert s.model_repository == tmp_path and s.http.port == 9300  # type: ignore[attr-defined]
    both: object = settings(str(tmp_path), "--model-repository", str(tmp_path))
    assert both.model_repository == tmp_path  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=r"two model repositories: .* and --model-repository .*; give one"):
        settings(str(tmp_path), "--model-repository", str(tmp_path / "other"))
