"""Every bad request of tests/conftest.py BAD_REQUESTS against a real server on a free
port: the right status and a message naming the problem, and the server serves on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bad_input_server(
    tmp_path_factory: pytest.TempPathFactory,
    write_add_sub: Callable[..., Path],
    write_identity_bytes: Callable[..., Path],
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("bad-inputs")
    write_add_sub(repo, config='name: "add_sub"\nmax_batch_size: 8\ndynamic_batching { }')
    write_identity_bytes(repo)
    with ServerProcess(repo, "--max-request-bytes", str(1 << 20)) as server:
        yield server


def test_bad_request_through_a_real_server(bad_input_server: ServerProcess, bad_request: Any) -> None:
    base = f"http://{bad_input_server.http_url}"
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post(
            f"/v2/models/{bad_request.model}/infer", content=bad_request.body, headers=bad_request.headers
        )
        assert r.status_code == bad_request.status, r.text
        assert bad_request.message in r.json()["error"]
        ok = {
            "inputs": [
                {"name": n, "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        good = c.post("/v2/models/add_sub/infer", json=ok)
        assert good.status_code == 200
        np.testing.assert_allclose(good.json()["outputs"][0]["data"], [2.0, 4.0])
