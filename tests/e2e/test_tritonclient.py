"""Triton's own clients against a real milliserve: HTTP JSON, HTTP binary, gRPC, gRPC streaming."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from milliserve.examples.minilm import tokenizer_path
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


def reference(repo: Path, model: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(repo / model / "1" / "model.onnx")).run(None, feeds)


@pytest.mark.parametrize("binary", [True, False], ids=["http-binary", "http-json"])
def test_http_infer_matches_onnxruntime(server: ServerProcess, example_repo: Path, binary: bool) -> None:
    x = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    with httpclient.InferenceServerClient(server.http_url) as c:
        inp = httpclient.InferInput("features", [5, 64], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("probabilities", binary_data=binary)
        got = c.infer("fraud_mlp", [inp], outputs=[out], request_id="abc")
        assert got.get_response()["id"] == "abc"
        np.testing.assert_allclose(
            got.as_numpy("probabilities"),
            reference(example_repo, "fraud_mlp", {"features": x})[0],
            rtol=1e-5,
            atol=1e-6,
        )


def test_grpc_infer_matches_onnxruntime(server: ServerProcess, example_repo: Path) -> None:
    x = np.random.default_rng(1).normal(size=(3, 64)).astype(np.float32)
    c = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("features", [3, 64], "FP32")
    inp.set_data_from_numpy(x)
    got = c.infer("fraud_mlp", [inp], model_version="1")
    np.testing.assert_allclose(
        got.as_numpy("probabilities"),
        reference(example_repo, "fraud_mlp", {"features": x})[0],
        rtol=1e-5,
        atol=1e-6,
    )
    c.close()


def test_grpc_stream_answers_every_request(server: ServerProcess) -> None:
    results: queue.Queue[Any] = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    for i in range(20):
        inp = grpcclient.InferInput("features", [1, 64], "FP32")
        inp.set_data_from_numpy(np.full((1, 64), i / 20, np.float32))
        c.async_stream_infer("fraud_mlp", [inp], request_id=str(i))
    got = [results.get(timeout=10) for _ in range(20)]
    c.stop_stream()
    c.close()
    assert all(err is None for _, err in got)
    assert sorted(int(r.get_response().id) for r, _ in got) == list(range(20))


def test_minilm_embeds_tokenized_text(server: ServerProcess, example_repo: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.enable_padding()
    encs = tok.encode_batch(["fraud checks must be fast", "a sentence about cats"])
    ids = np.asarray([e.ids for e in encs], np.int64)
    mask = np.asarray([e.attention_mask for e in encs], np.int64)
    c = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [
        grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
        grpcclient.InferInput("attention_mask", list(ids.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    emb = c.infer("minilm", inputs).as_numpy("embedding")
    c.close()
    ref = reference(example_repo, "minilm", {"input_ids": ids, "attention_mask": mask})[0]
    np.testing.assert_allclose(emb, ref, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_metadata_config_and_statistics_through_both_clients(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as h:
        assert h.is_server_live() and h.is_server_ready() and h.is_model_ready("fraud_mlp")
        assert h.get_server_metadata()["name"] == "milliserve"
        assert h.get_model_metadata("minilm")["outputs"][0] == {
            "name": "embedding",
            "datatype": "FP32",
            "shape": [-1, 384],
        }
        cfg = h.get_model_config("fraud_mlp")
        assert cfg["max_batch_size"] == 64 and cfg["dynamic_batching"]["preferred_batch_size"] == [8, 16]
        assert "model_stats" in h.get_inference_statistics("fraud_mlp")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    assert g.is_server_live() and g.is_model_ready("minilm")
    assert g.get_model_config("minilm").config.max_batch_size == 32
    assert g.get_model_metadata("fraud_mlp").inputs[0].shape == [-1, 64]
    stats = g.get_inference_statistics("fraud_mlp").model_stats[0]
    assert stats.inference_count >= 1 and stats.execution_count >= 1
    # the index lists the models: refused while the repository API is off (the default)
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
        g.get_model_repository_index()
    g.close()


def test_bad_requests_get_the_right_status_through_the_clients(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as h:
        inp = httpclient.InferInput("features", [1, 63], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 63), np.float32))
        with pytest.raises(InferenceServerException) as err:
            h.infer("fraud_mlp", [inp])
        assert err.value.status() == "400"
        assert (
            "input 'features' has shape [1, 63] but model 'fraud_mlp' expects [-1, 64]" in err.value.message()
        )
        with pytest.raises(InferenceServerException) as err:
            h.infer("fraud_mlp", [inp], model_version="9")
        assert err.value.status() == "404"
    g = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput("features", [1, 64], "INT32")
    ginp.set_data_from_numpy(np.zeros((1, 64), np.int32))
    with pytest.raises(InferenceServerException) as err:
        g.infer("fraud_mlp", [ginp])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "datatype INT32" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        g.infer("ghost", [ginp])
    assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:
        g.load_model("fraud_mlp")
    assert err.value.status() == "StatusCode.PERMISSION_DENIED"
    # and it still serves
    ok = grpcclient.InferInput("features", [1, 64], "FP32")
    ok.set_data_from_numpy(np.zeros((1, 64), np.float32))
    assert g.infer("fraud_mlp", [ok]).as_numpy("probabilities").shape == (1, 2)
    g.close()
