"""Speculative execution through a real server: a hedged model step over two replicas of
add_sub (one stuck 2 s on every batch, one 0.2 s) and a confidence cascade of two tiny
softmax classifiers. The stalls come from the test-only ``test_stall_ms`` parameter."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

ROOMY = {"x-request-deadline-ms": "60000"}  # these tests are about answers, not budgets

REPLICA = """
name: {name}
max_batch_size: 8
dynamic_batching: {{}}
parameters: {{test_stall_ms: "{stall_ms}", test_stall_probability: "1"}}
"""

HEDGED = """
name: hedged
platform: ensemble
max_batch_size: 8
input: [{name: x, data_type: TYPE_FP32, dims: [2]}]
output: [{name: y, data_type: TYPE_FP32, dims: [2]}]
ensemble_scheduling:
  step:
    - model_name: rep_a
      input_map: {INPUT0: x, INPUT1: x}
      output_map: {OUTPUT0: y}
      hedge: {replicas: [rep_b], after_ms: 50, max_queue: 2}
"""

CLASSIFIER = """
name: {name}
max_batch_size: 16
dynamic_batching: {{}}
"""

CASCADE = """
name: cascade
platform: ensemble
max_batch_size: 16
input: [{name: x, data_type: TYPE_FP32, dims: [2]}]
output:
  - {name: probabilities, data_type: TYPE_FP32, dims: [2]}
  - {name: label, data_type: TYPE_INT64, dims: [1]}
  - {name: answered_by, data_type: TYPE_STRING, dims: [1]}
ensemble_scheduling:
  step:
    - cascade: {fast: fast_clf, full: full_clf, escalate_below: 0.8, answered_by: answered_by}
"""

FAST_SCALE, FULL_SCALE = 1.0, -2.0  # the full model answers a different function

# the same cascade over a full model that stalls 3 s per batch: held by one request, it
# cannot answer another within that one's deadline
BUSY_FULL = """
name: busy_full
max_batch_size: 16
dynamic_batching: {}
parameters: {test_stall_ms: "3000", test_stall_probability: "1"}
"""
CASCADE_LATE = CASCADE.replace("name: cascade", "name: cascade_late").replace(
    "full: full_clf", "full: busy_full"
)


def _write_classifier(repo: Path, name: str, scale: float) -> None:
    """probabilities = softmax(scale * x), label = argmax (x FP32 [batch, 2])."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["z"]),
        helper.make_node("Softmax", ["z"], ["probabilities"], axis=-1),
        helper.make_node("ArgMax", ["z"], ["label"], axis=-1, keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch", 1]),
        ],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [scale])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.yaml").write_text(CLASSIFIER.format(name=name))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, write_add_sub: Any) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("speculative")
    for name, stall_ms in (("rep_a", 2000), ("rep_b", 200)):
        config = REPLICA.format(name=name, stall_ms=stall_ms)
        write_add_sub(repo, name=name, config=config, config_name="config.yaml", dims=("batch", 2))
    _write_classifier(repo, "fast_clf", FAST_SCALE)
    _write_classifier(repo, "full_clf", FULL_SCALE)
    _write_classifier(repo, "busy_full", FULL_SCALE)
    (repo / "busy_full" / "config.yaml").write_text(BUSY_FULL)
    for name, text in (("hedged", HEDGED), ("cascade", CASCADE), ("cascade_late", CASCADE_LATE)):
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(text)
    with ServerProcess(repo) as proc:
        yield proc


def _metrics(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(server.metrics_url).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    want = set(labels.items())
    found = [v for (n, ls), v in _metrics(server).items() if n == name and want <= ls]
    return sum(found)


def _hedges(server: ServerProcess) -> dict[str, float]:
    return {
        k: _metric(
            server, f"milliserve_pipeline_hedges_{k}_total", model="hedged", step="step 1 (model rep_a)"
        )
        for k in ("sent", "won", "suppressed")
    }


def _pending(server: ServerProcess, model: str) -> float:
    return _metric(server, "milliserve_pending_request_count", model=model)


def _stats(c: httpx.Client, server: ServerProcess, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = c.get(f"http://{server.http_url}/v2/models/{model}/stats").json()
    return stats["model_stats"][0]


def _infer(c: httpx.Client, server: ServerProcess, model: str, x: list[list[float]]) -> httpx.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(x), 2], "data": x}]}
    if model.startswith("rep_"):  # a replica called directly
        body = {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": [len(x), 2], "data": x} for n in ("INPUT0", "INPUT1")
            ]
        }
    r = c.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body, headers=ROOMY, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _alone(server: ServerProcess, model: str, x: list[list[float]]) -> httpx.Response:
    with httpx.Client() as c:
        return _infer(c, server, model, x)


def test_hedged_requests_take_the_first_answer_and_cancel_the_other(server: ServerProcess, poll: Any) -> None:
    with httpx.Client() as c:
        # 1. The first request goes to rep_a (both idle: the step's own model first), which
        # is stuck 2 s; after 50 ms the hedge goes to rep_b, which answers in 0.2 s.
        r = _infer(c, server, "hedged", [[1.5, -2.0]])
        assert r.json()["outputs"][0]["data"] == [3.0, -4.0]
        assert r.json()["parameters"]["answered_by"] == "rep_b"
        assert "hedge;dur=" in r.headers["server-timing"]
        assert _hedges(server) == {"sent": 1, "won": 1, "suppressed": 0}

        # 2. rep_a is still busy with that copy (a running batch cannot be stopped), so the
        # next request goes to rep_b; it is slow too (0.2 s > 50 ms), and the hedge goes to
        # rep_a, where it queues behind the stall. rep_b answers first: the queued copy is
        # cancelled, leaves rep_a's queue at once and never runs.
        r = _infer(c, server, "hedged", [[0.5, 0.25]])
        assert r.json()["outputs"][0]["data"] == [1.0, 0.5]
        assert r.json()["parameters"]["answered_by"] == "rep_b"
        assert _hedges(server) == {"sent": 2, "won": 1, "suppressed": 0}
        assert _pending(server, "rep_a") <= 1  # the running batch only: the copy left the queue
        poll.until(lambda: _pending(server, "rep_a") == 0, what="rep_a idle")
        stats = _stats(c, server, "rep_a")
        assert (stats["execution_count"], stats["inference_count"]) == (1, 1)  # the first copy only

        # 3. No hedge to a long queue: rep_a runs one request and has two queued (max_queue
        # 2); the pipeline's request goes to rep_b, and when it is late the hedge is suppressed.
        with ThreadPoolExecutor(3) as pool:
            fillers = [pool.submit(_alone, server, "rep_a", [[1.0, 1.0]]) for _ in range(3)]
            poll.until(lambda: _pending(server, "rep_a") == 3, what="rep_a busy with two queued")
            r = _infer(c, server, "hedged", [[2.0, 1.0]])
            assert r.json()["outputs"][0]["data"] == [4.0, 2.0]
            assert r.json()["parameters"]["answered_by"] == "rep_b"
            assert _hedges(server) == {"sent": 2, "won": 1, "suppressed": 1}
            for f in fillers:
                assert f.result().json()["outputs"][0]["data"] == [2.0, 2.0]


def test_a_hedge_that_lost_is_not_a_failure_of_its_replica(server: ServerProcess, poll: Any) -> None:
    """Whichever replica goes first, rep_a (stalled 2 s) is beaten by rep_b (0.2 s): its copy
    is cancelled, and it counts that as a lost hedge, never as a CANCELED failure (the alert
    a failure ratio would fire on a healthy hedged setup)."""

    def lost() -> float:
        return _metric(server, "milliserve_inference_hedge_lost_total", model="rep_a")

    before = lost()
    r = _alone(server, "hedged", [[1.0, 1.0]])
    assert r.json()["parameters"]["answered_by"] == "rep_b"
    poll.until(lambda: lost() > before, 30, "rep_a's losing copy counted as lost")
    for replica in ("rep_a", "rep_b"):
        failures = _metric(server, "milliserve_inference_request_failure_total", model=replica)
        assert failures == 0, (replica, failures)
        with httpx.Client() as c:
            assert _stats(c, server, replica)["inference_stats"]["fail"]["count"] == 0


def _softmax(z: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)  # type: ignore[no-any-return]


def test_cascade_answers_confident_rows_fast_and_escalates_the_rest(server: ServerProcess) -> None:
    # top probabilities under the fast model: 0.95, 0.62, 0.88, 0.5
    x = np.array([[3.0, 0.0], [0.5, 0.0], [0.0, 2.0], [0.0, 0.0]], np.float32)
    fast, full = _softmax(FAST_SCALE * x), _softmax(FULL_SCALE * x)
    escalated = [False, True, False, True]
    want = np.where(np.array(escalated)[:, None], full, fast)
    with httpx.Client() as c:
        before = _stats(c, server, "full_clf")["inference_count"]
        r = _infer(c, server, "cascade", x.tolist())
        out = {o["name"]: o for o in r.json()["outputs"]}
        np.testing.assert_allclose(np.array(out["probabilities"]["data"]).reshape(4, 2), want, atol=1e-6)
        assert out["label"]["data"] == want.argmax(1).tolist()
        assert out["answered_by"]["data"] == ["fast_clf", "full_clf", "fast_clf", "full_clf"]
        assert r.json()["parameters"]["answered_by"] == "fast_clf,full_clf"
        assert _stats(c, server, "full_clf")["inference_count"] - before == 2  # only the escalated rows
        stages = r.headers["server-timing"]
        assert "queue;dur=" in stages and "infer;dur=" in stages

        r = _infer(c, server, "cascade", [[4.0, 0.0]])  # confident: the full model is not asked
        assert r.json()["parameters"]["answered_by"] == "fast_clf"
        assert _stats(c, server, "full_clf")["inference_count"] - before == 2
    labels = {"model": "cascade", "step": "step 1 (cascade)"}
    assert _metric(server, "milliserve_pipeline_cascade_fast_rows_total", **labels) == 3
    assert _metric(server, "milliserve_pipeline_cascade_escalated_rows_total", **labels) == 2


def test_a_cascade_whose_escalation_would_miss_the_deadline_answers_fast(
    server: ServerProcess, poll: Any
) -> None:
    x = [[0.5, 0.0]]  # top probability 0.62 under the fast model: escalated
    fast = _softmax(FAST_SCALE * np.array(x, np.float32))
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": x}]}
    with ThreadPoolExecutor(1) as pool, httpx.Client() as c:
        # one request holds busy_full's only instance for 3 s
        blocker = pool.submit(_alone, server, "busy_full", [[1.0, 0.0]])
        poll.until(lambda: _pending(server, "busy_full") >= 1, 30, "busy_full held")
        before = _stats(c, server, "busy_full")["inference_count"]
        r = c.post(
            f"http://{server.http_url}/v2/models/cascade_late/infer",
            json=body,
            headers={"x-request-deadline-ms": "1500"},
            timeout=60,
        )
        assert r.status_code == 200, r.text  # was a 429 although the fast model had answered
        answer = r.json()
        assert answer["parameters"]["answered_by"] == "fast_clf"
        assert answer["parameters"]["escalation_skipped"] == "deadline"
        out = {o["name"]: o["data"] for o in answer["outputs"]}
        assert out["answered_by"] == ["fast_clf"]
        np.testing.assert_allclose(np.array(out["probabilities"]).reshape(1, 2), fast, atol=1e-6)
        blocker.result()
        assert _stats(c, server, "busy_full")["inference_count"] - before == 1  # the blocker's only
    labels = {"model": "cascade_late", "step": "step 1 (cascade)"}
    assert _metric(server, "milliserve_pipeline_cascade_escalations_skipped_total", **labels) == 1
