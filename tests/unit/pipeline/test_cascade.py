"""The confidence cascade on fake models: which rows escalate, how the answers merge, and the
step end to end (values, answered_by, counts, one request to the full model)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from milliserve.config.step_config import PipelineStep
from milliserve.errors import BackendError, ConfigError, DeadlineUnmeetableError
from milliserve.pipeline.cascade import CascadeStep, escalated_rows, merge_rows
from milliserve.pipeline.steps import tensor
from milliserve.protocol.types import InferRequest
from milliserve.road import Call

from .conftest import FakeModel, Models


def test_rows_under_the_threshold_escalate() -> None:
    p = np.array([[0.9, 0.1], [0.55, 0.45], [0.2, 0.8], [0.5, 0.5]], np.float32)
    assert escalated_rows(p, 0.8).tolist() == [1, 3]  # 0.8 itself is confident enough
    assert escalated_rows(p, 0.95).tolist() == [0, 1, 2, 3]
    assert escalated_rows(p, 0.5).tolist() == []


def test_escalation_reads_every_column_and_empty_batches() -> None:
    assert escalated_rows(np.array([[0.1, 0.2, 0.7]]), 0.6).tolist() == []
    assert escalated_rows(np.array([[[0.3], [0.7]]]), 0.8).tolist() == [0]  # [batch, 2, 1]
    assert escalated_rows(np.zeros((0, 2), np.float32), 0.8).tolist() == []


def test_merge_puts_the_full_rows_in_place() -> None:
    fast = np.arange(8, dtype=np.float32).reshape(4, 2)
    full = np.array([[-1, -1], [-3, -3]], np.float32)
    merged = merge_rows(fast, full, np.array([1, 3]))
    assert merged.tolist() == [[0, 1], [-1, -1], [4, 5], [-3, -3]]
    assert fast[1].tolist() == [2, 3]  # the fast answer is not changed in place
    strings = merge_rows(
        np.array([[b"a"], [b"b"]], dtype=object), np.array([[b"z"]], dtype=object), np.array([0])
    )
    assert strings[:, 0].tolist() == [b"z", b"b"]
    with pytest.raises(ValueError, match="cannot put 1 rows of shape \\[3\\]"):
        merge_rows(fast, np.zeros((1, 3), np.float32), np.array([0]))


def _step(models: Models, **cascade: Any) -> CascadeStep:
    spec = {"fast": "fast", "full": "full", "escalate_below": 0.8, **cascade}
    return CascadeStep("step 1 (cascade)", PipelineStep.model_validate({"cascade": spec}), models.get_model)


def _run(step: CascadeStep, x: Any) -> tuple[dict[str, Any], Call]:
    tensors = {"x": tensor("x", np.asarray(x, np.float32))}
    call = Call(InferRequest("p", "", []))
    asyncio.run(step.run(tensors, call))
    return tensors, call


def test_a_mixed_batch(models: Models) -> None:
    fast = FakeModel("fast")  # echoes x: its confidence is the row's largest value
    full = FakeModel("full", fn=lambda x: 1 - x)
    step = _step(models.add(fast, full), answered_by="who")
    x = [[0.9, 0.1], [0.6, 0.4], [0.15, 0.85], [0.5, 0.5]]
    tensors, call = _run(step, x)
    got = tensors["probabilities"].data
    np.testing.assert_allclose(got, [[0.9, 0.1], [0.4, 0.6], [0.15, 0.85], [0.5, 0.5]], atol=1e-6)
    assert tensors["who"].datatype == "BYTES"
    assert tensors["who"].data[:, 0].tolist() == [b"fast", b"full", b"fast", b"full"]
    assert len(full.requests) == 1  # the escalated rows, in one request
    assert full.requests[0].inputs[0].shape == (2, 2)
    assert step.counts == {
        "cascade_fast_rows": 2,
        "cascade_escalated_rows": 2,
        "cascade_escalations_skipped": 0,
    }
    assert call.notes["answered_by"] == "fast,full"
    assert call.stages["infer"] == 0.0  # both models' stages (the fakes report their delay)


def test_confident_batches_never_reach_the_full_model(models: Models) -> None:
    fast, full = FakeModel("fast"), FakeModel("full")
    step = _step(models.add(fast, full))
    tensors, call = _run(step, [[0.95, 0.05]])
    assert full.requests == []
    assert call.notes["answered_by"] == "fast"
    assert "who" not in tensors
    _, call = _run(step, [[0.5, 0.5]])
    assert call.notes["answered_by"] == "full"


def test_an_escalation_that_would_miss_the_deadline_keeps_the_fast_answer(models: Models) -> None:
    fast = FakeModel("fast")
    full = FakeModel("full", error=DeadlineUnmeetableError("request to model 'full' would miss its deadline"))
    step = _step(models.add(fast, full), answered_by="who")
    tensors, call = _run(step, [[0.9, 0.1], [0.6, 0.4]])
    np.testing.assert_allclose(tensors["probabilities"].data, [[0.9, 0.1], [0.6, 0.4]])
    assert tensors["who"].data[:, 0].tolist() == [b"fast", b"fast"]
    assert call.notes == {"answered_by": "fast", "escalation_skipped": "deadline"}
    assert step.counts == {
        "cascade_fast_rows": 2,
        "cascade_escalated_rows": 0,
        "cascade_escalations_skipped": 1,
    }
    # any other failure of the full model is still the request's
    full.error = BackendError("full: broken")
    with pytest.raises(BackendError, match="broken"):
        _run(step, [[0.6, 0.4]])


def test_models_must_match_and_have_the_probabilities(models: Models) -> None:
    models.add(FakeModel("fast"), FakeModel("full", outputs=("scores",)))
    same = r"step 1 \(cascade\): models 'fast' and 'full' must have the same outputs"
    with pytest.raises(ConfigError, match=same):
        _step(models)
    models.add(FakeModel("full", outputs=("scores",)), FakeModel("fast", outputs=("scores",)))
    with pytest.raises(ConfigError, match=r"probabilities 'probabilities' is not an output of 'fast'"):
        _step(models)


def test_an_answered_by_output_declared_other_than_string_fails_the_load(
    models: Models, tmp_path: Any
) -> None:
    from milliserve.cache.response_cache import CacheFactory
    from milliserve.config.model_config import ModelConfig
    from milliserve.pipeline.ensemble import build_steps

    models.add(FakeModel("fast"), FakeModel("full"))
    config = ModelConfig.model_validate(
        {
            "name": "p",
            "platform": "ensemble",
            "max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
            "output": [
                {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [2]},
                {"name": "answered_by", "data_type": "TYPE_FP32", "dims": [1]},
            ],
            "ensemble_scheduling": {
                "step": [
                    {
                        "cascade": {
                            "fast": "fast",
                            "full": "full",
                            "escalate_below": 0.8,
                            "answered_by": "answered_by",
                        }
                    }
                ]
            },
        }
    )
    # it used to load and then answer every request with a 500
    with pytest.raises(
        ConfigError,
        match=r"step 1 \(cascade\): answered_by 'answered_by' holds model names: "
        r"declare it TYPE_STRING, not FP32",
    ):
        build_steps(config, tmp_path, models.get_model, CacheFactory())
