"""Feature tables, defaults for unknown entities, and the assembled tensor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from milliserve.errors import ConfigError, InvalidInputError
from milliserve.features.store import FeatureSet, TableFeatures
from milliserve.protocol.types import InferTensor

TABLE = "user_id,age_days,txn_7d,chargebacks\nu1,400,12,0\nu2,3,90,2\n"


def _set(tmp_path: Path, **kw: object) -> FeatureSet:
    (tmp_path / "users.csv").write_text(TABLE)
    names = ["txn_7d", "chargebacks", "age_days"]  # any order, any subset of the columns
    source = TableFeatures(tmp_path / "users.csv", "user_id", names)
    return FeatureSet("user_features", names, [0.0, 0.0, -1.0], source, **kw)  # type: ignore[arg-type]


def test_batch_fetch_assembles_rows_in_order_with_defaults(tmp_path: Path) -> None:
    fs = _set(tmp_path, entity_input="user")
    ids = np.array([[b"u2"], [b"nobody"], [b"u1"]], dtype=object)
    got_ids, rest = fs.entity_ids([InferTensor("user", "BYTES", (3, 1), ids)], {})
    assert got_ids == ["u2", "nobody", "u1"] and rest == []
    tensor, notes = asyncio.run(fs.assemble(got_ids))
    np.testing.assert_array_equal(tensor, np.array([[90, 2, 3], [0, 0, -1], [12, 0, 400]], np.float32))
    assert tensor.dtype == np.float32 and notes == {"features_defaulted": "1 unknown entity"}


def test_entity_from_a_parameter_and_clear_errors(tmp_path: Path) -> None:
    fs = _set(tmp_path, entity_parameter="user_id")
    assert fs.entity_ids([], {"user_id": "u1"})[0] == ["u1"]
    with pytest.raises(InvalidInputError, match="parameter 'user_id'"):
        fs.entity_ids([], {})
    with pytest.raises(ConfigError, match="no columns \\['missing'\\]"):
        TableFeatures(tmp_path / "users.csv", "user_id", ["missing"])
    with pytest.raises(ConfigError, match="no key column 'uid'"):
        TableFeatures(tmp_path / "users.csv", "uid", ["age_days"])
