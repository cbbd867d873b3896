"""Online features through a real server: an in-process table, and Redis hashes loaded with
`milliserve features load`, including Redis going down."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from milliserve.testing import RedisServer, ServerProcess

pytestmark = pytest.mark.e2e

TABLE = "user_id,age_days,txn_7d,chargebacks\nu1,400,12,0\nu2,3,90,2\n"
CONFIG = """
name: add_sub
max_batch_size: 8
features:
  input: INPUT1
  names: [age_days, txn_7d, chargebacks]
  defaults: {{age_days: -1}}
  entity_parameter: user_id
  source: {source}
  on_unavailable: {on_unavailable}
"""


def _ask(client: httpx.Client, url: str, user: str, x: list[float]) -> httpx.Response:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": x}],
        "parameters": {"user_id": user},
    }
    return client.post(f"http://{url}/v2/models/add_sub/infer", json=body)


def _output0(r: httpx.Response) -> list[float]:
    out = next(o for o in r.json()["outputs"] if o["name"] == "OUTPUT0")
    return [float(v) for v in out["data"]]


def test_table_features_fill_the_model_input(tmp_path: Path, write_add_sub: Callable[..., Path]) -> None:
    model = write_add_sub(tmp_path, dims=("batch", 3))
    (model / "users.csv").write_text(TABLE)
    (model / "config.yaml").write_text(
        CONFIG.format(source="{table: users.csv, key: user_id}", on_unavailable="defaults")
    )
    with ServerProcess(tmp_path) as server, httpx.Client() as c:
        r = _ask(c, server.http_url, "u2", [1.0, 1.0, 1.0])
        assert r.status_code == 200, r.text
        assert _output0(r) == [4.0, 91.0, 3.0]  # INPUT0 + the user's features
        assert "features" in r.headers["server-timing"]
        meta = c.get(f"http://{server.http_url}/v2/models/add_sub").json()
        assert [i["name"] for i in meta["inputs"]] == ["INPUT0"]  # INPUT1 is built from features
        unknown = _ask(c, server.http_url, "ghost", [0.0, 0.0, 0.0])
        assert _output0(unknown) == [-1.0, 0.0, 0.0]  # declared defaults
        assert unknown.json()["parameters"]["features_defaulted"] == "1 unknown entity"
        missing = c.post(
            f"http://{server.http_url}/v2/models/add_sub/infer",
            json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [0, 0, 0]}]},
        )
        assert missing.status_code == 400 and "parameter 'user_id'" in missing.json()["error"]


def test_redis_features_loaded_by_the_cli_and_redis_outage(
    tmp_path: Path, write_add_sub: Callable[..., Path], poll: Any
) -> None:
    model = write_add_sub(tmp_path / "repo", dims=("batch", 3))
    table = tmp_path / "users.csv"
    table.write_text(TABLE)
    with RedisServer() as redis_server:
        load_cmd = [sys.executable, "-m", "milliserve", "features", "load", str(table)]
        load_cmd += ["--redis", redis_server.url, "--key", "user_id", "--prefix", "user:"]
        load = subprocess.run(
            load_cmd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert load.returncode == 0 and "wrote 2 entities" in load.stdout, load.stderr
        (model / "config.yaml").write_text(
            CONFIG.format(source="{redis_prefix: 'user:', key: user_id}", on_unavailable="defaults")
        )
        # a Redis bound far above a healthy call on a loaded CI machine, where the default 50 ms
        # was sometimes missed by the first fetch (it dials Redis); a stopped Redis refuses at once
        env = {**os.environ, "MILLISERVE_REDIS__BACKOFF_S": "0.1", "MILLISERVE_REDIS__TIMEOUT_MS": "1000"}
        with (
            ServerProcess(tmp_path / "repo", "--redis-url", redis_server.url, env=env) as server,
            httpx.Client() as c,
        ):
            r = _ask(c, server.http_url, "u1", [0.0, 0.0, 0.0])
            assert _output0(r) == [400.0, 12.0, 0.0] and "parameters" not in r.json()
            redis_server.stop()
            down = _ask(c, server.http_url, "u1", [0.0, 0.0, 0.0])
            assert down.status_code == 200 and _output0(down) == [-1.0, 0.0, 0.0]
            assert down.json()["parameters"]["features_defaulted"] == "feature store unavailable"
            assert down.elapsed.total_seconds() < 0.5  # refused, not waited for (1 s bound)
            redis_server.start()  # empty again (no persistence): reload, and it recovers by itself
            subprocess.run(
                load_cmd,
                check=True,
                capture_output=True,
                timeout=60,
            )
            answers: list[httpx.Response] = []

            def back() -> bool:  # once the breaker lets Redis back
                answers.append(_ask(c, server.http_url, "u1", [1.0, 1.0, 1.0]))
                return "parameters" not in answers[-1].json()

            poll.until(back, timeout_s=15, what="Redis features back")
            assert _output0(answers[-1]) == [401.0, 13.0, 1.0]
