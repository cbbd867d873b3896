"""An OpenVINO IR model served by a real server (``platform: "openvino"``), through
tritonclient over HTTP and gRPC: answers equal to OpenVINO's own, Triton metadata and
config, dynamic batching of a model exported with a batch of 1, the response cache, a
bad shape answered 400, and a server without openvino that keeps serving its other models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openvino as ov
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

CONFIG = """\
name: "ov_mlp"
platform: "openvino"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [
  { name: "probs" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 2000 }
response_cache { enable: true }
parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }
parameters { key: "PERFORMANCE_HINT" value: { string_value: "LATENCY" } }
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, openvino_mlp: Any, write_add_sub: Any) -> Path:
    root = tmp_path_factory.mktemp("ov_repo")
    openvino_mlp.write(root, config=CONFIG)  # exported with a static batch of 1
    write_add_sub(root)  # an onnxruntime model beside it
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(repo) as proc:
        yield proc


def openvino_answers(repo: Path, x: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """What OpenVINO itself computes, at f32, from the same IR (batch reshaped to x's)."""
    model = ov.Core().read_model(repo / "ov_mlp" / "1" / "model.xml")
    model.reshape({"x": ov.PartialShape(list(x.shape))})
    own = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({"x": x})
    return {"probs": own["probs"], "label": own["label"]}


def test_http_and_grpc_answers_equal_openvinos(server: ServerProcess, repo: Path) -> None:
    x = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    want = openvino_answers(repo, x)
    with httpclient.InferenceServerClient(server.http_url) as h:
        inp = httpclient.InferInput("x", [3, 16], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        res = h.infer("ov_mlp", [inp])
    g = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput("x", [3, 16], "FP32")
    ginp.set_data_from_numpy(x)
    gres = g.infer("ov_mlp", [ginp])
    g.close()
    for got in (res, gres):
        assert np.allclose(got.as_numpy("probs"), want["probs"], atol=1e-6)
        np.testing.assert_array_equal(got.as_numpy("label"), want["label"])
        assert got.as_numpy("label").dtype == np.int64


def test_metadata_and_config_say_openvino(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as h:
        meta = h.get_model_metadata("ov_mlp")
        cfg = h.get_model_config("ov_mlp")
    assert meta["platform"] == "openvino"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [
        {"name": "probs", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "label", "datatype": "INT64", "shape": [-1, 1]},
    ]
    assert (cfg["platform"], cfg["backend"], cfg["max_batch_size"]) == ("openvino", "openvino", 16)
    assert cfg["parameters"]["INFERENCE_NUM_THREADS"] == {"string_value": "1"}
    g = grpcclient.InferenceServerClient(server.grpc_url)
    gcfg = g.get_model_config("ov_mlp").config
    assert (gcfg.platform, gcfg.backend) == ("openvino", "openvino")
    assert [list(o.dims) for o in gcfg.output] == [[4], [1]]
    assert g.get_model_metadata("ov_mlp").inputs[0].shape == [-1, 16]
    # the onnxruntime model beside it keeps its own
    assert g.get_model_config("add_sub").config.backend == "onnxruntime"
    g.close()


def stats(server: ServerProcess) -> Any:
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return g.get_inference_statistics("ov_mlp").model_stats[0]
    finally:
        g.close()


def test_concurrent_requests_are_batched(server: ServerProcess, repo: Path) -> None:
    before = stats(server)
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(1, 16)).astype(np.float32) for _ in range(96)]
    g = grpcclient.InferenceServerClient(server.grpc_url)

    def one(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        inp = grpcclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        return g.infer("ov_mlp", [inp]).as_numpy("probs")  # type: ignore[no-any-return]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, xs))
    g.close()
    np.testing.assert_allclose(
        np.concatenate(got), openvino_answers(repo, np.concatenate(xs))["probs"], atol=1e-6
    )
    after = stats(server)
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == 96
    assert executions < inferences, f"{executions} executions for {inferences} requests: no batching"
    assert any(b.batch_size > 1 for b in after.batch_stats)


def test_the_response_cache_answers_a_repeated_request(server: ServerProcess) -> None:
    x = np.full((1, 16), 0.25, np.float32)
    before = stats(server).inference_stats.cache_hit.count
    with httpclient.InferenceServerClient(server.http_url) as h:
        inp = httpclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        first, again = (h.infer("ov_mlp", [inp]).as_numpy("probs") for _ in range(2))
    np.testing.assert_array_equal(first, again)
    assert stats(server).inference_stats.cache_hit.count == before + 1


def test_a_bad_shape_is_invalid_argument(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as h:
        inp = httpclient.InferInput("x", [2, 15], "FP32")
        inp.set_data_from_numpy(np.zeros((2, 15), np.float32))
        with pytest.raises(InferenceServerException) as err:
            h.infer("ov_mlp", [inp])
    assert err.value.status() == "400"
    assert "input 'x' has shape [2, 15] but model 'ov_mlp' expects [-1, 16]" in err.value.message()
    g = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput("x", [17, 16], "FP32")  # over max_batch_size
    ginp.set_data_from_numpy(np.zeros((17, 16), np.float32))
    with pytest.raises(InferenceServerException) as err:
        g.infer("ov_mlp", [ginp])
    g.close()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_without_openvino_the_model_is_unavailable_and_the_others_serve(repo: Path, tmp_path: Path) -> None:
    # a package named openvino that cannot be imported stands first on the path: the
    # server's interpreter then has no openvino, as after `pip install milliserve`
    (tmp_path / "openvino").mkdir()
    (tmp_path / "openvino" / "__init__.py").write_text("raise ImportError('No module named openvino')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    args = ("--model-control-mode", "explicit", "--load-model", "*", "--strict-readiness", "false")
    with ServerProcess(repo, *args, env=env) as server, httpx.Client() as c:
        body = {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": [1, 2], "data": [3, 1]} for n in ("INPUT0", "INPUT1")
            ]
        }
        r = c.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body)
        assert r.status_code == 200, r.text
        assert c.get(f"http://{server.http_url}/v2/models/ov_mlp/ready").status_code != 200
        index = {m["name"]: m for m in c.post(f"http://{server.http_url}/v2/repository/index").json()}
    assert index["add_sub"]["state"] == "READY"
    assert index["ov_mlp"]["state"] == "UNAVAILABLE"
    reason = index["ov_mlp"]["reason"]
    assert "pip install 'milliserve[openvino]'" in reason and "\n" not in reason, reason
