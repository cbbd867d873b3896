"""Model control as Triton's (explicit and poll modes) with tritonclient over HTTP and gRPC:
loads with a config override and with the model's files, bad overrides refused, the texts
Triton's clients look for, and a polled repository followed."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from milliserve.examples.triton import build_triton_examples
from milliserve.testing import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

# a model that is not in the repository, sent whole with its load request
NEW_CONFIG = json.dumps(
    {
        "name": "sent",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
    }
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("control")
    build_triton_examples(repo, ["simple", "simple_int8"])
    return repo


@pytest.fixture(scope="module")
def tmpdir_of_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server_tmp")


@pytest.fixture(scope="module")
def server(repo: Path, tmpdir_of_server: Path) -> Iterator[ServerProcess]:
    env = dict(os.environ, TMPDIR=str(tmpdir_of_server))  # where override files are written
    with ServerProcess(repo, "--model-control-mode", "explicit", env=env) as proc:
        yield proc


def client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def add(c: Any, protocol: str, model: str) -> np.ndarray[Any, Any]:
    m = httpclient if protocol == "http" else grpcclient
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    ins = [m.InferInput("INPUT0", [1, 16], "INT32"), m.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    out: np.ndarray[Any, Any] = c.infer(model, ins).as_numpy("OUTPUT0")
    return out


def max_batch(c: Any, protocol: str, model: str) -> int:
    config = c.get_model_config(model)
    return int(config["max_batch_size"] if protocol == "http" else config.config.max_batch_size)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_with_a_config_override(server: ServerProcess, protocol: str) -> None:
    c = client(server, protocol)
    c.load_model("simple")
    assert max_batch(c, protocol, "simple") == 8
    c.load_model("simple", config='{"max_batch_size":"16"}')  # Triton's JSON: "16" is 16
    assert max_batch(c, protocol, "simple") == 16
    np.testing.assert_array_equal(add(c, protocol, "simple"), 2 * np.arange(16).reshape(1, 16))
    c.load_model("simple")  # without an override: the repository's config again
    assert max_batch(c, protocol, "simple") == 8
    c.unload_model("simple")
    assert not c.is_model_ready("simple")


def test_load_a_model_sent_with_its_files(server: ServerProcess, repo: Path, tmpdir_of_server: Path) -> None:
    onnx_bytes = (repo / "simple" / "1" / "model.onnx").read_bytes()
    # gRPC: tritonclient sends the files as bytes parameters
    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.load_model("sent", config=NEW_CONFIG, files={"file:1/model.onnx": onnx_bytes})
    assert g.is_model_ready("sent") and max_batch(g, "grpc", "sent") == 4
    np.testing.assert_array_equal(add(g, "grpc", "sent"), 2 * np.arange(16).reshape(1, 16))
    written = [p for p in tmpdir_of_server.iterdir() if p.name.startswith("milliserve-override-")]
    assert len(written) == 1 and (written[0] / "sent" / "1" / "model.onnx").read_bytes() == onnx_bytes
    g.unload_model("sent")
    assert not any(p.name.startswith("milliserve-override-") for p in tmpdir_of_server.iterdir())
    # HTTP: base64 strings in the parameters (Triton's extension_model_repository.md)
    body = {"parameters": {"config": NEW_CONFIG, "file:1/model.onnx": base64.b64encode(onnx_bytes).decode()}}
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/sent/load", json=body, timeout=60)
    assert r.status_code == 200, r.text
    h = httpclient.InferenceServerClient(server.http_url)
    np.testing.assert_array_equal(add(h, "http", "sent"), 2 * np.arange(16).reshape(1, 16))
    h.unload_model("sent")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_loads_are_refused_with_tritons_words(server: ServerProcess, protocol: str) -> None:
    c = client(server, protocol)
    grpc_ = protocol == "grpc"

    def refused(call: Any, status: str, text: str) -> None:
        with pytest.raises(InferenceServerException) as err:
            call()
        assert text in err.value.message(), err.value.message()
        assert status in str(err.value.status()), err.value.status()

    bad = "INVALID_ARGUMENT" if grpc_ else "400"
    refused(
        lambda: c.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}'),
        bad,
        "failed to load 'simple': invalid config override",
    )
    refused(lambda: c.load_model("wrong_model_name"), "NOT_FOUND" if grpc_ else "404", "failed to load")
    if grpc_:  # tritonclient's HTTP client cannot send bytes in JSON
        refused(
            lambda: c.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"}),
            "INTERNAL",
            "failed to poll from model repository",
        )
        refused(
            lambda: c.load_model("simple", config="{}", files={"file:../escape": b"a"}),
            bad,
            "relative path inside the model folder",
        )
    assert c.is_server_live()


def test_tritons_error_texts(server: ServerProcess) -> None:
    h = httpclient.InferenceServerClient(server.http_url)
    h.load_model("simple_int8")
    a = np.zeros((1, 16), np.int32)
    ins = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for i in ins:
        i.set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as err:
        h.infer("wrong_model_name", ins)
    assert err.value.message().startswith("Request for unknown model: 'wrong_model_name' is not found")
    assert err.value.status() == "404"
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="simple_int8", model_version="wrong_specification")
    for name in ("INPUT0", "INPUT1"):
        t = request.inputs.add(name=name, datatype="INT8", shape=[1, 16])
        t.contents.int_contents[:] = list(range(16))
    with pytest.raises(grpc.RpcError) as rpc:
        stub.ModelInfer(request)
    assert "failed to get model version from specified version string 'wrong_specification'" in str(rpc.value)
    request.model_version = ""
    request.raw_input_contents.append(np.zeros(16, np.int8).tobytes())
    with pytest.raises(grpc.RpcError) as rpc:
        stub.ModelInfer(request)
    text = (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'simple_int8'"
    )
    assert text in str(rpc.value) and rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    h.unload_model("simple_int8")


def test_poll_mode_follows_the_repository(tmp_path: Path) -> None:
    build_triton_examples(tmp_path, ["simple"])
    with ServerProcess(tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "0.1") as proc:
        c = httpclient.InferenceServerClient(proc.http_url)
        assert c.is_model_ready("simple")
        shutil.copytree(tmp_path / "simple", tmp_path / "tmp_copy")
        config = (tmp_path / "tmp_copy" / "config.pbtxt").read_text().replace('"simple"', '"simple_copy"')
        (tmp_path / "tmp_copy" / "config.pbtxt").write_text(config)
        (tmp_path / "tmp_copy").rename(tmp_path / "simple_copy")  # appears whole
        wait_until(lambda: c.is_model_ready("simple_copy"), what="the new model loaded by a poll")
        np.testing.assert_array_equal(add(c, "http", "simple_copy"), 2 * np.arange(16).reshape(1, 16))
        cfg = tmp_path / "simple" / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
        wait_until(lambda: max_batch(c, "http", "simple") == 4, what="the changed config reloaded")
        shutil.rmtree(tmp_path / "simple_copy")
        wait_until(lambda: not c.is_model_ready("simple_copy"), what="the removed model unloaded")
        with pytest.raises(InferenceServerException, match="repository API is disabled"):
            c.load_model("simple")  # in poll mode the repository decides (Triton)
