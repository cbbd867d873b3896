"""The pipeline's built-in steps on their own: rules, custom Python functions, the config
checks of ensemble_scheduling, and the tensor-flow check of build_steps."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from milliserve.cache.response_cache import CacheFactory
from milliserve.config.model_config import ModelConfig, load_model_config
from milliserve.config.step_config import PythonStep, Rules
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.pipeline.ensemble import build_steps
from milliserve.pipeline.steps import PythonCall, RulesStep, tensor
from milliserve.protocol.types import InferRequest
from milliserve.road import Call


def _ctx() -> Call:
    return Call(InferRequest("p", "", []))


def _run_rules(rules: Rules, scores: np.ndarray[Any, Any]) -> dict[str, Any]:
    tensors = {rules.input: tensor(rules.input, scores)}
    asyncio.run(RulesStep("step 1", rules).run(tensors, _ctx()))
    return tensors


FRAUD_RULES = Rules.model_validate(
    {
        "input": "p",
        "column": 1,
        "thresholds": [{"at_least": 0.9, "label": "decline"}, {"at_least": 0.5, "label": "review"}],
        "default": "approve",
        "output": "decision",
        "score_output": "score",
    }
)


def test_thresholds_first_reached_wins_and_the_default_below_all() -> None:
    fraud = np.array([0.95, 0.9, 0.6, 0.5, 0.49, 0.0], dtype=np.float32)
    out = _run_rules(FRAUD_RULES, np.stack([1 - fraud, fraud], axis=1))
    decision = out["decision"]
    assert decision.datatype == "BYTES" and decision.shape == (6, 1)
    assert [v.decode() for v in decision.data[:, 0]] == [
        "decline",
        "decline",
        "review",
        "review",
        "approve",
        "approve",
    ]
    np.testing.assert_array_equal(out["score"].data[:, 0], fraud)
    assert out["score"].datatype == "FP32"


def test_labels_take_the_largest_column() -> None:
    rules = Rules(input="p", output="label", labels=("negative", "positive"), score_output="score")
    out = _run_rules(rules, np.array([[0.8, 0.2], [0.3, 0.7]], dtype=np.float32))
    assert [v.decode() for v in out["label"].data[:, 0]] == ["negative", "positive"]
    np.testing.assert_allclose(out["score"].data[:, 0], [0.8, 0.7])


def test_rules_name_a_shape_mismatch() -> None:
    rules = Rules(input="p", output="label", labels=("a", "b", "c"))
    with pytest.raises(BackendError, match=r"has 2 columns but rules\.labels names 3"):
        _run_rules(rules, np.zeros((1, 2), np.float32))
    with pytest.raises(BackendError, match="no column 1"):
        _run_rules(FRAUD_RULES, np.zeros((1, 1), np.float32))


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"input": "p", "output": "o"}, "exactly one of thresholds or labels"),
        ({"input": "p", "output": "o", "thresholds": [{"at_least": 1, "label": "x"}]}, "needs a default"),
    ],
)
def test_rules_config_is_checked(rules: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Rules.model_validate(rules)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_steps.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            from milliserve.errors import InvalidInputError

            def double(inputs, parameters):
                return {"y": inputs["x"] * float(parameters.get("factor", "2"))}

            async def later(inputs, parameters):
                return {"y": inputs["x"] + 1}

            def broken(inputs, parameters):
                raise ZeroDivisionError("division by zero")

            def picky(inputs, parameters):
                raise InvalidInputError("x must be positive")

            def forgetful(inputs, parameters):
                return {}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_steps"


def _call(module: str, fn: str, **params: str) -> np.ndarray[Any, Any]:
    spec = PythonStep(function=f"{module}:{fn}", inputs=("x",), outputs=("y",), parameters=params)
    tensors = {"x": tensor("x", np.array([[1.0, 2.0]], np.float32))}
    asyncio.run(PythonCall("step 2", spec, "preprocess").run(tensors, _ctx()))
    return tensors["y"].data


def test_python_steps_sync_async_and_parameters(user_module: str) -> None:
    np.testing.assert_array_equal(_call(user_module, "double"), [[2.0, 4.0]])
    np.testing.assert_array_equal(_call(user_module, "double", factor="3"), [[3.0, 6.0]])
    np.testing.assert_array_equal(_call(user_module, "later"), [[2.0, 3.0]])


def test_python_step_failures_are_named(user_module: str) -> None:
    with pytest.raises(BackendError, match=r"my_steps:broken\) failed: ZeroDivisionError"):
        _call(user_module, "broken")
    with pytest.raises(InvalidInputError, match="x must be positive"):  # the client's fault stays 4xx
        _call(user_module, "picky")
    with pytest.raises(BackendError, match=r"did not return \['y'\]"):
        _call(user_module, "forgetful")
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        _call(user_module, "nope")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        _call("no_such_module", "f")
    with pytest.raises(ValueError, match=r"package\.module:function"):
        PythonStep(function="no_colon", inputs=(), outputs=())


def _pipeline(steps: list[dict[str, Any]], **extra: Any) -> ModelConfig:
    data = {
        "name": "p",
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "label", "data_type": "TYPE_STRING", "dims": [1]}],
        "ensemble_scheduling": {"step": steps},
        **extra,
    }
    return ModelConfig.model_validate(data)


LABEL_STEP = {"rules": {"input": "x", "output": "label", "labels": ["a", "b"]}}


@pytest.mark.parametrize(
    ("steps", "extra", "message"),
    [
        ([{"model_name": "m", "rules": LABEL_STEP["rules"]}], {}, "exactly one of"),
        ([{}], {}, "exactly one of"),
        ([{**LABEL_STEP, "input_map": {"a": "b"}}], {}, "belong to model steps"),
        ([LABEL_STEP], {"instance_group": [{"count": 2}]}, "do not apply to an ensemble"),
        ([LABEL_STEP], {"input": []}, "declares its input and output"),
    ],
)
def test_ensemble_config_is_checked(steps: list[dict[str, Any]], extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _pipeline(steps, **extra)
    with pytest.raises(ValueError, match="go together"):
        ModelConfig(name="m", platform="ensemble")


def test_build_steps_checks_that_every_tensor_is_made(tmp_path: Path) -> None:
    def no_models(name: str, version: str) -> Any:
        raise AssertionError("no model steps here")

    ok = _pipeline([LABEL_STEP])
    assert len(build_steps(ok, tmp_path, no_models, CacheFactory())) == 1
    unread = _pipeline([{"rules": {"input": "z", "output": "label", "labels": ["a"]}}])
    with pytest.raises(ConfigError, match=r"step 1 \(rules\) reads \['z'\], which neither"):
        build_steps(unread, tmp_path, no_models, CacheFactory())
    unmade = _pipeline([{"rules": {"input": "x", "output": "other", "labels": ["a", "b"]}}])
    with pytest.raises(ConfigError, match=r"no step makes the pipeline outputs \['label'\]"):
        build_steps(unmade, tmp_path, no_models, CacheFactory())


def test_the_fraud_example_parses_from_pbtxt(tmp_path: Path) -> None:
    from milliserve.examples.fraud import USER_FEATURES, build_fraud

    cfg = load_model_config(build_fraud(tmp_path))
    assert cfg is not None and cfg.ensemble_scheduling is not None
    kinds = [s.kind for s in cfg.ensemble_scheduling.step]
    assert kinds == ["features", "python", "model", "rules"]
    features = cfg.ensemble_scheduling.step[0].features
    assert features is not None and features.names == USER_FEATURES
    assert cfg.ensemble_scheduling.step[2].input_map == {"features": "features"}
    assert cfg.stage_budget_s("features") == 0.005


def test_thresholds_agree_for_a_few_rows_and_for_many() -> None:
    rng = np.random.default_rng(3)
    fraud = np.concatenate([rng.random(40), [0.9, 0.5, 0.0, 1.0]]).astype(np.float32)
    scores = np.stack([1 - fraud, fraud], axis=1)
    many = [v.decode() for v in _run_rules(FRAUD_RULES, scores)["decision"].data[:, 0]]
    few = [
        v.decode()
        for i in range(0, len(scores), 4)
        for v in _run_rules(FRAUD_RULES, scores[i : i + 4])["decision"].data[:, 0]
    ]
    expected = [
        "decline" if s >= np.float32(0.9) else "review" if s >= np.float32(0.5) else "approve" for s in fraud
    ]
    assert many == few == expected
