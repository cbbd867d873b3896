"""A load request's overrides (repository/overrides.py) and the poll mode's view of a
repository (repository/poll.py)."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from milliserve.errors import BackendError, InvalidInputError, RequestError
from milliserve.repository.overrides import MAX_FILES, parse_override
from milliserve.repository.poll import fingerprint


def test_no_parameters_no_override() -> None:
    assert parse_override("m", {}) is None


def test_config_is_tritons_json() -> None:
    o = parse_override(
        "m",
        {
            "config": '{"max_batch_size": "16", '
            '"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}]}'
        },
    )
    assert o is not None and o.config.max_batch_size == 16 and o.config.input[0].dims == (4,)
    assert o.files == {}


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        (
            {"config": '"parameters": {"config": {{"max_batch_size": "16"}}}'},
            InvalidInputError,
            "failed to load 'm': invalid config override",
        ),
        ({"config": '{"bogus": 1}'}, InvalidInputError, 'no field named "bogus"'),
        ({"config": '{"name": "other"}'}, InvalidInputError, "does not match"),
        ({"config": 7}, InvalidInputError, "must be a JSON string"),
        ({"file:1/model.onnx": b"x"}, InvalidInputError, "need a 'config' parameter"),
        ({"config": "{}", "file:../x": b"x"}, InvalidInputError, "relative path inside the model folder"),
        ({"config": "{}", "file:/etc/x": b"x"}, InvalidInputError, "relative path"),
        ({"config": "{}", "file:1/.hidden": b"x"}, InvalidInputError, "relative path"),
        ({"config": "{}", "file:1//x": b"x"}, InvalidInputError, "relative path"),
        ({"config": "{}", "file:1\\x": b"x"}, InvalidInputError, "relative path"),
        ({"config": "{}", "file:1/x": "not base64!"}, InvalidInputError, "base64"),
        ({"color": "red"}, RequestError, "parameters \\['color'\\] are not supported"),
    ],
)
def test_bad_overrides_are_refused(params: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse_override("m", params)


def test_too_many_files() -> None:
    files = {f"file:1/f{i}": b"" for i in range(MAX_FILES + 1)}
    with pytest.raises(InvalidInputError, match=f"at most {MAX_FILES}"):
        parse_override("m", {"config": "{}", **files})


def test_files_go_to_a_private_folder_and_are_removed() -> None:
    o = parse_override(
        "m",
        {"config": "{}", "file:1/model.onnx": base64.b64encode(b"onnx").decode(), "file:labels.txt": b"a"},
    )
    assert o is not None
    folder = o.write("m")
    assert folder.name == "m" and (folder / "1" / "model.onnx").read_bytes() == b"onnx"
    assert (folder / "labels.txt").read_bytes() == b"a"
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700  # only the server's user
    o.discard()
    assert not folder.parent.exists()


def test_a_file_the_filesystem_refuses_fails_as_tritons_does() -> None:
    o = parse_override("m", {"config": "{}", "file:" + "A" * 256: b"a"})  # longer than NAME_MAX
    assert o is not None
    with pytest.raises(BackendError, match="failed to load 'm': failed to poll from model repository"):
        o.write("m")
    assert o.folder is None


def test_fingerprint_sees_added_changed_and_removed_files(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"a")
    first = fingerprint(tmp_path)
    (tmp_path / "config.pbtxt").write_text("x")
    second = fingerprint(tmp_path)
    assert second != first and [r[0] for r in second] == ["config.pbtxt", "1/model.onnx"]
    (tmp_path / "1" / "model.onnx").write_bytes(b"bb")
    assert fingerprint(tmp_path) != second
