"""A budgeted model refuses what it cannot serve in time, and accepts again once it is fast:
after one slow request (a loop whose length comes from the data, so its size says nothing
of its cost), the latency estimate said every request would miss the budget, and since a
refused request never runs, the old estimator refused them forever."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

CONFIG = """
name: "looper"
max_batch_size: 0
budget { p99_ms: 50 }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def write_looper(repo: Path) -> None:
    """y = x @ I, ``n`` times over: the cost is in the value of n, not in the tensor sizes."""
    eye = helper.make_tensor("W", TensorProto.FLOAT, [64, 64], np.eye(64, dtype=np.float32).ravel().tolist())
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["v_in", "W"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 64]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 64]),
        ],
        [eye],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Squeeze", ["n"], ["trips"]),
            helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body),
        ],
        "looper",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "looper" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "looper" / "1" / "model.onnx"))
    (repo / "looper" / "config.pbtxt").write_text(CONFIG)


def body(trips: int) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "n", "shape": [1], "datatype": "INT64", "data": [trips]},
            {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64},
        ]
    }


def test_a_budgeted_model_accepts_again_after_a_slow_request(tmp_path: Path) -> None:
    write_looper(tmp_path)
    with ServerProcess(tmp_path) as srv, httpx.Client(timeout=120) as c:
        url = f"http://{srv.http_url}/v2/models/looper/infer"
        for _ in range(5):  # fast requests teach the estimator
            assert c.post(url, json=body(1)).status_code == 200
        slow = c.post(url, json=body(1_000_000))  # a second or two (more on a loaded machine)
        assert slow.status_code in (200, 429), slow.text
        # The same small request now looks like a second's work to the estimator: refused
        refused = c.post(url, json=body(1))
        assert refused.status_code == 429 and "would miss its deadline" in refused.json()["error"]
        # ... but not forever: it re-measures the idle model and accepts again
        deadline = time.monotonic() + 30
        streak, codes = 0, []
        while streak < 5:
            assert time.monotonic() < deadline, f"still refusing after 30 s: {codes[-20:]}"
            code = c.post(url, json=body(1)).status_code
            codes.append(code)
            assert code in (200, 429)
            streak = streak + 1 if code == 200 else 0
            time.sleep(0.05)  # a client's pace, not a wait for a condition
        recovered = len(codes) - 5
    # the issue asks for "within a few seconds"; on a quiet machine this takes well under 2 s
    assert recovered * 0.05 < 10, codes
