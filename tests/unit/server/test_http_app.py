"""The HTTP front end in-process (httpx.ASGITransport) over real ONNX Runtime models."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from milliserve.server.assembly import Server
from milliserve.testing import InProcessServer

BATCHING = """
name: "add_sub"
max_batch_size: 8
dynamic_batching { }
instance_group [ { count: 1 } ]
"""


@asynccontextmanager
async def client(repo: Path, **kw: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Server]]:
    async with InProcessServer(repo, listen=False, **kw) as server:
        transport = httpx.ASGITransport(app=server.http_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c, server


def infer_body(a: np.ndarray, b: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "INPUT0", "shape": list(a.shape), "datatype": "FP32", "data": a.reshape(-1).tolist()},
            {"name": "INPUT1", "shape": list(b.shape), "datatype": "FP32", "data": b.reshape(-1).tolist()},
        ],
        **extra,
    }


def outputs(resp: httpx.Response) -> dict[str, np.ndarray]:
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in doc["outputs"]}


@pytest.fixture
def repo(tmp_path: Path, write_add_sub: Callable[..., Path]) -> Path:
    write_add_sub(tmp_path, config=BATCHING)
    return tmp_path


def test_health_metadata_config_and_stats(repo: Path, run: Any) -> None:
    async def main() -> None:
        async with client(repo) as (c, _):
            assert (await c.get("/v2/health/live")).status_code == 200
            assert (await c.get("/v2/health/ready")).status_code == 200
            assert (await c.get("/v2")).json()["name"] == "milliserve"
            meta = (await c.get("/v2/models/add_sub")).json()
            assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}
            assert (await c.get("/v2/models/add_sub/versions/1/ready")).status_code == 200
            cfg = (await c.get("/v2/models/add_sub/config")).json()
            assert cfg["max_batch_size"] == 8 and cfg["input"][0]["dims"] == [-1]  # completed from the model
            a = np.ones((1, 3), np.float32)
            np.testing.assert_allclose(
                outputs(await c.post("/v2/models/add_sub/infer", json=infer_body(a, a)))["OUTPUT0"], 2 * a
            )
            stats = (await c.get("/v2/models/add_sub/stats")).json()["model_stats"][0]
            assert stats["inference_count"] == 1 and stats["inference_stats"]["success"]["count"] == 1

    run(main())


def test_every_request_gets_its_own_answer_whatever_batch_it_rode_in(repo: Path, run: Any) -> None:
    async def main() -> None:
        rng = np.random.default_rng(1)
        async with client(repo) as (c, server):
            pairs = [
                (
                    rng.normal(size=(int(rng.integers(1, 3)), 5)).astype(np.float32),
                    rng.normal(size=(1, 5)).astype(np.float32),
                )
                for _ in range(40)
            ]
            bodies = [infer_body(a, np.repeat(b, len(a), 0)) for a, b in pairs]
            resps = await asyncio.gather(*(c.post("/v2/models/add_sub/infer", json=b) for b in bodies))
            for (a, b), r in zip(pairs, resps, strict=True):
                out = outputs(r)
                np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
                np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)
            stats = server.dataplane.model_statistics("add_sub")[0]
            assert stats["execution_count"] < 40  # some requests really shared a batch

    run(main())


def test_one_malformed_request_never_fails_its_neighbours(repo: Path, run: Any) -> None:
    async def main() -> None:
        async with client(repo) as (c, _):
            good = infer_body(np.ones((1, 4), np.float32), np.ones((1, 4), np.float32))
            # caught by validation, before it can join a batch
            invalid = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
            # passes validation (both dims are variable) but the model cannot run it: it joins a
            # batch, the batch fails, and the batch is rerun one by one so only it fails
            unrunnable = infer_body(np.ones((1, 4), np.float32), np.ones((1, 3), np.float32))
            bodies = [good, invalid, good, unrunnable] * 8
            resps = await asyncio.gather(*(c.post("/v2/models/add_sub/infer", json=b) for b in bodies))
            codes = [r.status_code for r in resps]
            assert codes[0::2] == [200] * 16
            # the model's own failure on this input's shapes is the client's error, named
            assert codes[1::4] == [400] * 8 and codes[3::4] == [400] * 8
            assert "the model cannot run on this input" in resps[3].json()["error"]
            assert "Attempting to broadcast" in resps[3].json()["error"]

    run(main())


def test_bad_input_gets_a_named_4xx_and_the_server_keeps_serving(
    tmp_path: Path,
    write_add_sub: Callable[..., Path],
    write_identity_bytes: Callable[..., Path],
    run: Any,
    bad_request: Any,
) -> None:
    """Cases come from tests/conftest.py (BAD_REQUESTS), shared with the real-server test."""
    write_add_sub(tmp_path, config=BATCHING)
    write_identity_bytes(tmp_path)

    async def main() -> None:
        async with client(tmp_path) as (c, _):
            r = await c.post(
                f"/v2/models/{bad_request.model}/infer", headers=bad_request.headers, content=bad_request.body
            )
            assert r.status_code == bad_request.status, r.text
            assert bad_request.message in r.json()["error"]
            a = np.ones((1, 2), np.float32)
            assert (await c.post("/v2/models/add_sub/infer", json=infer_body(a, a))).status_code == 200

    run(main())


def test_unknown_version_and_routes_are_404(repo: Path, run: Any) -> None:
    async def main() -> None:
        async with client(repo) as (c, _):
            r = await c.get("/v2/models/add_sub/versions/7")
            assert r.status_code == 404 and "version 7 is not found" in r.json()["error"]
            assert (await c.get("/v3/anything")).status_code == 404
            assert (await c.get("/v2/models/add_sub/bogus")).status_code == 404

    run(main())


def test_bytes_model_round_trips_binary_and_json(
    tmp_path: Path, write_identity_bytes: Callable[..., Path], run: Any
) -> None:
    write_identity_bytes(tmp_path)

    async def main() -> None:
        async with client(tmp_path) as (c, _):
            r = await c.post(
                "/v2/models/strings/infer",
                json={
                    "inputs": [
                        {"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": ["héllo", "wörld"]}
                    ]
                },
            )
            assert r.json()["outputs"][0]["data"] == ["héllo", "wörld"]

    run(main())


def test_repository_api_is_off_by_default(repo: Path, run: Any) -> None:
    async def main() -> None:
        async with client(repo) as (c, _):
            r = await c.post("/v2/repository/models/add_sub/unload")
            assert r.status_code == 403 and "--model-control-mode explicit" in r.json()["error"]
            # the index lists the models: behind the same switch, unless names are exposed
            r = await c.post("/v2/repository/index")
            assert r.status_code == 403 and "--model-control-mode explicit" in r.json()["error"]
        async with client(repo, expose_model_names=True) as (c, _):
            assert (await c.post("/v2/repository/index")).json()[0]["state"] == "READY"

    run(main())


def test_model_that_fails_to_load_is_reported_and_the_others_serve(repo: Path, run: Any) -> None:
    broken = repo / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not onnx")
    wrong = repo / "wrong_config"
    (wrong / "1").mkdir(parents=True)
    (wrong / "1" / "model.onnx").write_bytes((repo / "add_sub" / "1" / "model.onnx").read_bytes())
    (wrong / "config.pbtxt").write_text(
        'name: "wrong_config"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [-1] } ]'
    )

    async def main() -> None:
        async with client(repo, expose_model_names=True) as (c, _):
            index = {row["name"]: row for row in (await c.post("/v2/repository/index")).json()}
            assert index["add_sub"]["state"] == "READY"
            assert index["broken"]["state"] == "UNAVAILABLE" and "could not load" in index["broken"]["reason"]
            assert (
                "field 'input'" in index["wrong_config"]["reason"]
                and "'X'" in index["wrong_config"]["reason"]
            )
            r = await c.post("/v2/models/broken/infer", json={"inputs": []})
            assert r.status_code == 503 and "not ready" in r.json()["error"]
            assert (await c.get("/v2/models/broken/ready")).status_code == 503
            # as Triton's strict readiness: a model that should serve and cannot makes the server unready
            assert (await c.get("/v2/health/ready")).status_code == 503
            a = np.ones((1, 2), np.float32)
            assert (await c.post("/v2/models/add_sub/infer", json=infer_body(a, a))).status_code == 200

        async with client(repo, strict_readiness=False) as (c, _):
            assert (await c.get("/v2/health/ready")).status_code == 200  # the lenient setting

        # explicit mode: a model that failed and was then unloaded on purpose is no failure
        async with client(repo, model_control_mode="explicit", load_models=["*"]) as (c, _):
            assert (await c.get("/v2/health/ready")).status_code == 503
            for name in ("broken", "wrong_config"):
                assert (await c.post(f"/v2/repository/models/{name}/unload")).status_code == 200
            assert (await c.get("/v2/health/ready")).status_code == 200

    run(main())


def test_reloading_a_new_version_under_traffic_fails_no_request(
    tmp_path: Path, write_add_sub: Callable[..., Path], run: Any, poll: Any
) -> None:
    write_add_sub(tmp_path, config=BATCHING)

    async def main() -> None:
        async with client(tmp_path, model_control_mode="explicit") as (c, server):
            assert (await c.post("/v2/repository/models/add_sub/load")).status_code == 200
            a = np.ones((1, 2), np.float32)
            stop = asyncio.Event()
            results: list[tuple[int, float]] = []

            async def traffic() -> None:
                while not stop.is_set():
                    r = await c.post("/v2/models/add_sub/infer", json=infer_body(a, a))
                    results.append(
                        (
                            r.status_code,
                            float(np.asarray(r.json()["outputs"][0]["data"])[0])
                            if r.status_code == 200
                            else -1.0,
                        )
                    )

            tasks = [asyncio.create_task(traffic()) for _ in range(4)]
            await poll.until_async(lambda: len(results) >= 8, what="traffic answered by version 1")
            write_add_sub(tmp_path, version=2, scale=10.0)
            r = await c.post("/v2/repository/models/add_sub/load")
            assert r.status_code == 200, r.text
            swapped = len(results)
            await poll.until_async(lambda: len(results) >= swapped + 8, what="traffic after the reload")
            stop.set()
            await asyncio.gather(*tasks)
            assert {s for s, _ in results} == {200}
            assert results[0][1] == 2.0 and results[-1][1] == 20.0  # version 2 took over
            assert server.registry.versions("add_sub") == ["2"]
            assert (await c.post("/v2/repository/models/add_sub/unload")).status_code == 200
            assert (await c.post("/v2/models/add_sub/infer", json=infer_body(a, a))).status_code == 503

    run(main())


def test_model_parameters_are_checked_and_inline_execution_serves(
    tmp_path: Path, write_add_sub: Callable[..., Path], run: Any
) -> None:
    param = 'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
    write_add_sub(
        tmp_path,
        name="inline",
        config=BATCHING.replace("add_sub", "inline") + param.format(k="inline_execution", v="true"),
    )
    write_add_sub(tmp_path, name="bad_flag", config=param.format(k="inline_execution", v="maybe"))
    write_add_sub(tmp_path, name="typo", config=param.format(k="intra_op_threads", v="1"))

    async def main() -> None:
        async with client(tmp_path, expose_model_names=True) as (c, _):
            a = np.ones((2, 3), np.float32)
            np.testing.assert_allclose(
                outputs(await c.post("/v2/models/inline/infer", json=infer_body(a, a)))["OUTPUT0"], 2 * a
            )
            index = {row["name"]: row for row in (await c.post("/v2/repository/index")).json()}
            assert (
                "config.pbtxt" in index["bad_flag"]["reason"]
                and "'inline_execution' must be one of ('auto', 'true', 'false'), got 'maybe'"
                in index["bad_flag"]["reason"]
            )
            assert "unknown parameters ['intra_op_threads']" in index["typo"]["reason"]

    run(main())


def test_a_workers_private_app_answers_metrics_and_statistics_only(repo: Path, run: Any) -> None:
    """``serve --workers``: siblings ask each other on private ports; those serve nothing else."""

    async def go() -> None:
        async with InProcessServer(repo, listen=False) as server:
            transport = httpx.ASGITransport(app=server.http_app(local=True))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                metrics = await c.get("/metrics")  # 404 here only when metrics are off, not refused
                assert metrics.status_code == 200 or "private port" not in metrics.text
                assert (await c.get("/v2/models/stats")).status_code == 200
                assert (await c.get("/v2/models/add_sub/stats")).status_code == 200
                a = np.ones((1, 4), np.float32)
                for method, path, body in (
                    ("POST", "/v2/models/add_sub/infer", infer_body(a, a)),
                    ("GET", "/v2/models/add_sub", None),
                    ("GET", "/v2/health/ready", None),
                    ("POST", "/v2/repository/index", {}),
                ):
                    r = await c.request(method, path, json=body)
                    assert r.status_code == 404 and "private port" in r.json()["error"], path

    run(go())
