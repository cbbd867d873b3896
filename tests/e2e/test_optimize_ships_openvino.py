"""``milliserve optimize`` ships an OpenVINO variant (NNCF INT8) into a repository folder
that a real server loads through its ``openvino`` backend; tritonclient's answers over
HTTP and gRPC equal OpenVINO's own on the shipped IR, and the report says how it was
chosen.

What is tested here is shipping and serving, which hold on any CPU. NNCF INT8's accuracy
does not: its kernels choose their code by the CPU's features, and on an AVX2-only CPU the
variant scores more than a point below FP32 where AVX-512 VNNI keeps it within one. So
the run takes a tolerance wide enough for any instruction set (the quality gate of
``--ship`` has its own test, tests/unit/optimize/test_optimize_inputs.py), and the report
must say which features its figures hold for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from milliserve.examples.fraud_mlp import synthetic_transactions
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


def test_a_shipped_nncf_variant_serves_through_the_openvino_backend(
    example_repo: Path, tmp_path: Path
) -> None:
    x, y = synthetic_transactions(1200, seed=31)
    np.savez(tmp_path / "eval.npz", features=x, labels=y)
    np.savez(tmp_path / "calib.npz", features=x[:256])
    out = tmp_path / "repo" / "fraud_ov"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "milliserve",
            "optimize",
            str(example_repo / "fraud_mlp" / "1" / "model.onnx"),
            "--eval",
            str(tmp_path / "eval.npz"),
            "--calibration",
            str(tmp_path / "calib.npz"),
            "--variant",
            "fp32",
            "--variant",
            "nncf_int8",
            "--ship",
            "nncf_int8",
            "--tolerance",
            "1",  # accuracy in [0, 1]: any quality ships; the gate is not what this test is about
            "--rounds",
            "2",
            "--final-rounds",
            "5",
            "--batches",
            "1,8",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert (out / "1" / "model.xml").is_file() and (out / "1" / "model.bin").is_file()
    assert not (out / "1" / "model.onnx").exists()
    config = (out / "config.pbtxt").read_text()
    assert 'platform: "openvino"' in config and '"INFERENCE_PRECISION_HINT"' in config
    report = json.loads((out / "report.json").read_text())
    assert report["winner"] == "nncf_int8" and "shipped as asked" in report["why"]
    row = next(r for r in report["rows"] if r["name"] == "nncf_int8")
    assert row["runtime"] == "openvino" and row["servable"]
    flags = " ".join(report["cpu"]["flags"]) or "none of"
    holds = f"Accuracy and speed hold for a CPU with these features: {flags}"
    assert holds in (out / "report.md").read_text()

    batch = x[:5]
    compiled = ov.Core().compile_model(
        str(out / "1" / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": "1"}
    )
    expected = np.asarray(compiled(batch)[compiled.outputs[0]])
    with ServerProcess(out.parent) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            meta = client.get_model_metadata("fraud_ov")
            assert meta["platform"] == "openvino"
            inp = httpclient.InferInput("features", list(batch.shape), "FP32")
            inp.set_data_from_numpy(batch)
            got_http = client.infer("fraud_ov", [inp]).as_numpy("probabilities")
        with grpcclient.InferenceServerClient(server.grpc_url) as gclient:
            ginp = grpcclient.InferInput("features", list(batch.shape), "FP32")
            ginp.set_data_from_numpy(batch)
            got_grpc = gclient.infer("fraud_ov", [ginp]).as_numpy("probabilities")
    np.testing.assert_allclose(got_http, expected, atol=1e-5)
    np.testing.assert_allclose(got_grpc, expected, atol=1e-5)
