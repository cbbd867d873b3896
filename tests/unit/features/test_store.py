"""Feature tables, defaults for unknown entities, the assembled tensor, and Redis features
on a real redis-server: deadlines, and slow answers that do not bypass it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from milliserve.errors import ConfigError, InvalidInputError
from milliserve.features.fetch import entity_ids
from milliserve.features.store import FeatureSet, RedisFeatures, TableFeatures
from milliserve.protocol.types import InferTensor
from milliserve.testing import RedisServer

TABLE = "user_id,age_days,txn_7d,chargebacks\nu1,400,12,0\nu2,3,90,2\n"


def _set(tmp_path: Path, **kw: object) -> FeatureSet:
    (tmp_path / "users.csv").write_text(TABLE)
    names = ["txn_7d", "chargebacks", "age_days"]  # any order, any subset of the columns
    source = TableFeatures(tmp_path / "users.csv", "user_id", names)
    return FeatureSet("user_features", names, [0.0, 0.0, -1.0], source, **kw)  # type: ignore[arg-type]


def test_batch_fetch_assembles_rows_in_order_with_defaults(tmp_path: Path) -> None:
    fs = _set(tmp_path, entity_input="user")
    ids = np.array([[b"u2"], [b"nobody"], [b"u1"]], dtype=object)
    got_ids = entity_ids(fs, {"user": InferTensor("user", "BYTES", (3, 1), ids)}, {})
    assert got_ids == ["u2", "nobody", "u1"]
    tensor, notes = asyncio.run(fs.assemble(got_ids))
    np.testing.assert_array_equal(tensor, np.array([[90, 2, 3], [0, 0, -1], [12, 0, 400]], np.float32))
    assert tensor.dtype == np.float32 and notes == {"features_defaulted": "1 unknown entity"}


def test_a_nan_in_the_table_gets_its_default_and_ids_in_a_batch_keep_their_order(tmp_path: Path) -> None:
    (tmp_path / "users.csv").write_text("user_id,a,b\nu1,nan,2\nu2,3,nan\n")
    names = ["a", "b"]
    fs = FeatureSet("f", names, [-1.0, -2.0], TableFeatures(tmp_path / "users.csv", "user_id", names))
    out, unknown, unavailable = asyncio.run(fs.assemble_rows(["u2", "u1", "u2", "zz"]))
    np.testing.assert_array_equal(out, np.array([[3, -2], [-1, 2], [3, -2], [-1, -2]], np.float32))
    assert unknown.tolist() == [False, False, False, True] and not unavailable
    # a NaN default leaves the NaN a NaN, as it did before the table was cleaned at load
    fs = FeatureSet("f", names, [float("nan"), 0.0], TableFeatures(tmp_path / "users.csv", "user_id", names))
    out, _, _ = asyncio.run(fs.assemble_rows(["u1", "u2"]))
    assert np.isnan(out[0, 0]) and out[1].tolist() == [3.0, 0.0]


def test_entity_from_a_parameter_and_clear_errors(tmp_path: Path) -> None:
    fs = _set(tmp_path, entity_parameter="user_id")
    assert entity_ids(fs, {}, {"user_id": "u1"}) == ["u1"]
    with pytest.raises(InvalidInputError, match="parameter 'user_id'"):
        entity_ids(fs, {}, {})
    # a client's bad id is a 400 naming it, not a decoding error (a 500 before)
    bad = {"user": InferTensor("user", "BYTES", (1, 1), np.array([[b"\xff\xfe"]], dtype=object))}
    with pytest.raises(InvalidInputError, match="entity id 0 of input 'user' is not UTF-8"):
        entity_ids(_set(tmp_path, entity_input="user"), bad, {})
    long = {"user": InferTensor("user", "BYTES", (1, 1), np.array([[b"u" * 300]], dtype=object))}
    with pytest.raises(InvalidInputError, match="is 300 bytes long; ids are at most 256"):
        entity_ids(_set(tmp_path, entity_input="user"), long, {})
    with pytest.raises(ConfigError, match="no columns \\['missing'\\]"):
        TableFeatures(tmp_path / "users.csv", "user_id", ["missing"])
    with pytest.raises(ConfigError, match="no key column 'uid'"):
        TableFeatures(tmp_path / "users.csv", "uid", ["age_days"])


@pytest.fixture
def redis_features() -> Iterator[tuple[RedisServer, FeatureSet]]:
    with RedisServer() as server:
        loader = redis.Redis.from_url(server.url)
        loader.hset("user:u1", mapping={"age_days": 400, "txn_7d": 12, "chargebacks": 0})
        loader.hset("user:u2", mapping={"age_days": 3, "txn_7d": 90, "chargebacks": 2})
        loader.close()
        names = ["age_days", "txn_7d", "chargebacks"]
        # a bound far above a healthy call on a loaded CI machine (a 50 ms one was missed now
        # and then by a first dial), and far below the pause of the slow-Redis drill
        source = RedisFeatures(server.url, "user:", names, timeout_s=0.25, backoff_s=60)
        yield server, FeatureSet("user_features", names, [-1.0, 0.0, 0.0], source)


def test_redis_features_skip_redis_when_the_request_has_no_time_left(
    redis_features: tuple[RedisServer, FeatureSet],
) -> None:
    _, fs = redis_features
    source = fs.source
    assert isinstance(source, RedisFeatures)

    async def main() -> None:
        tensor, notes = await fs.assemble(["u1"], deadline=time.perf_counter() + 5)
        np.testing.assert_array_equal(tensor, [[400, 12, 0]])
        assert notes == {}
        tensor, notes = await fs.assemble(["u1"], deadline=time.perf_counter() - 0.001)
        np.testing.assert_array_equal(tensor, [[-1, 0, 0]])  # the defaults, at once
        assert notes == {"features_defaulted": "feature store unavailable"}
        assert source.breaker.errors == 0 and source.breaker.state == "closed"  # not Redis's fault
        await fs.close()

    asyncio.run(main())


def test_redis_features_a_few_slow_answers_do_not_bypass_redis(
    redis_features: tuple[RedisServer, FeatureSet], poll: Any
) -> None:
    server, fs = redis_features
    source = fs.source
    assert isinstance(source, RedisFeatures)

    async def fetched() -> bool:  # the first call also dials Redis
        _, notes = await fs.assemble(["u1"])
        return notes == {}

    async def main() -> None:
        await poll.until_async(fetched, timeout_s=10, what="features read from Redis")
        errors = source.breaker.errors
        pauser = redis.Redis.from_url(server.url)
        assert pauser.execute_command("CLIENT", "PAUSE", "1000", "ALL")  # every client waits
        slow = await asyncio.gather(*(fs.assemble(["u1", "u2"]) for _ in range(4)))
        assert all(notes == {"features_defaulted": "feature store unavailable"} for _, notes in slow)
        await asyncio.get_running_loop().run_in_executor(None, pauser.ping)  # the pause is over
        pauser.close()
        assert source.breaker.errors - errors == 4 and source.breaker.state == "closed"
        for ids in (["u2", "u1"], ["u1"], ["u2"]):  # the cancelled pipelines' replies are not read
            tensor, notes = await fs.assemble(ids)
            rows = {"u1": [400, 12, 0], "u2": [3, 90, 2]}
            np.testing.assert_array_equal(tensor, [rows[i] for i in ids])
            assert notes == {}
        await fs.close()

    asyncio.run(main())
