"""The pooling step (pipeline/pooling.py): each mode against a plain loop over the rows,
normalisation, Matryoshka sizes, the token counts, and when a tokenizer's pipeline may batch
(pooled, or through a classifier that reads the attention mask)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from milliserve.config.model_config import ModelConfig
from milliserve.config.step_config import PipelineStep, Pooling, TokenizerConfig
from milliserve.errors import BackendError, InvalidInputError
from milliserve.examples.minilm import tokenizer_path
from milliserve.features.tokenize import TokenizerStep
from milliserve.pipeline.batching import batching_wanted
from milliserve.pipeline.pooling import PoolingStep, pool
from milliserve.pipeline.steps import ModelCall, RulesStep, tensor
from milliserve.protocol.types import InferRequest
from milliserve.road import Call

rng = np.random.default_rng(0)
HIDDEN = rng.normal(size=(3, 5, 8)).astype(np.float32)
# right padding, left padding, no padding
MASK = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=np.int64)


def _loop(mode: str) -> np.ndarray[Any, Any]:
    rows = []
    for h, m in zip(HIDDEN, MASK, strict=True):
        kept = h[m == 1]
        rows.append({"mean": kept.mean(0), "cls": kept[0], "last_token": kept[-1]}[mode])
    return np.array(rows)


@pytest.mark.parametrize("mode", ["mean", "cls", "last_token"])
def test_modes_pool_the_attended_tokens(mode: str) -> None:
    np.testing.assert_allclose(pool(HIDDEN, MASK, mode), _loop(mode), rtol=1e-5, atol=1e-6)


def _run(config: Pooling, hidden: Any = HIDDEN, **parameters: Any) -> dict[str, Any]:
    step = PoolingStep("step 3 (pooling)", config)
    tensors = {config.input: tensor(config.input, hidden), config.mask: tensor(config.mask, MASK)}
    call = Call(InferRequest("m", "", [], parameters=parameters))
    asyncio.run(step.run(tensors, call))
    return {k: np.asarray(v.data) for k, v in tensors.items()}


def test_normalised_vectors_and_token_counts() -> None:
    out = _run(Pooling())
    expected = _loop("mean") / np.linalg.norm(_loop("mean"), axis=1, keepdims=True)
    np.testing.assert_allclose(out["embedding"], expected, rtol=1e-5)
    assert out["tokens"].tolist() == [[3], [3], [5]]
    raw = _run(Pooling(normalize=False, tokens=None))
    np.testing.assert_allclose(raw["embedding"], _loop("mean"), rtol=1e-5)
    assert "tokens" not in raw
    pooled = _run(Pooling(mode="none", input="vec"), hidden=HIDDEN[:, 0])  # already one vector per row
    np.testing.assert_allclose(np.linalg.norm(pooled["embedding"], axis=1), 1.0, rtol=1e-6)


def test_dimensions_cut_then_renormalise_and_are_refused_where_not_listed() -> None:
    out = _run(Pooling(dimensions=(4, 2)), dimensions=4)["embedding"]
    cut = _loop("mean")[:, :4]
    np.testing.assert_allclose(out, cut / np.linalg.norm(cut, axis=1, keepdims=True), rtol=1e-5)
    assert _run(Pooling(), dimensions=8)["embedding"].shape == (3, 8)  # the full size: nothing to cut
    with pytest.raises(
        InvalidInputError, match=r"'dimensions' is 3, but this model's embeddings have 8, 4, 2"
    ):
        _run(Pooling(dimensions=(4, 2)), dimensions=3)
    with pytest.raises(InvalidInputError, match="cannot be shortened") as info:
        _run(Pooling(), dimensions=4)
    assert info.value.args[1] == "dimensions"
    with pytest.raises(InvalidInputError, match="positive integer"):
        _run(Pooling(dimensions=(4,)), dimensions="4")


def test_a_model_output_of_the_wrong_shape_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match=r"needs float \[batch, seq, dim\]"):
        _run(Pooling(), hidden=HIDDEN[:, 0])
    with pytest.raises(ValueError, match="every name must differ"):
        Pooling(output="tokens")


def test_a_tokenizer_pipeline_batches_only_when_pooled_before_its_outputs(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path().read_bytes())
    tok = TokenizerStep("step 1", TokenizerConfig(file="tokenizer.json"), tmp_path)

    class Encoder:  # a model step: row-wise, reads the ids
        name, stage, rowwise = "step 2 (model)", "", True
        needs, makes = ("input_ids", "attention_mask"), ("token_embeddings",)

    pooling = PoolingStep("step 3", Pooling())
    assert batching_wanted({}, 8, [tok, Encoder(), pooling], ["embedding", "tokens"])
    assert not batching_wanted({}, 8, [tok, Encoder()], ["token_embeddings"])  # padded rows out
    assert not batching_wanted({}, 8, [tok, Encoder(), pooling], ["embedding", "input_ids"])
    assert batching_wanted({}, 8, [RulesStep("r", _rules())], ["label"])


def test_a_tokenizer_pipeline_batches_through_a_classifier_that_reads_the_mask(tmp_path: Path) -> None:
    """A model that reads the tokenizer's attention mask and answers without a token axis
    (a classifier's probabilities) makes its rows whole again; one that does not read the
    mask, or answers per token, leaves them padded."""
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path().read_bytes())
    tok = TokenizerStep("step 1", TokenizerConfig(file="tokenizer.json"), tmp_path)

    def classifier(inputs: list[str], probability_dims: list[int]) -> ModelCall:
        config = ModelConfig.model_validate(
            {
                "name": "clf",
                "backend": "onnxruntime",
                "max_batch_size": 8,
                "input": [{"name": n, "data_type": "TYPE_INT64", "dims": [-1]} for n in inputs],
                "output": [{"name": "probabilities", "data_type": "TYPE_FP32", "dims": probability_dims}],
            }
        )
        step = PipelineStep(model_name="clf")
        return ModelCall(
            "step 2 (model clf)", step, inputs, ["probabilities"], lambda m, v: SimpleNamespace(config=config)
        )

    rules = RulesStep("step 3", _rules("probabilities", "score"))
    outputs = ["label", "score"]
    assert batching_wanted({}, 8, [tok, classifier(["input_ids", "attention_mask"], [2]), rules], outputs)
    assert not batching_wanted({}, 8, [tok, classifier(["input_ids"], [2]), rules], outputs)  # no mask
    per_token = classifier(["input_ids", "attention_mask"], [-1, 2])  # a tagger: per token
    assert not batching_wanted({}, 8, [tok, per_token, rules], outputs)
    assert not batching_wanted(
        {"pipeline_batching": "false"},
        8,
        [tok, classifier(["input_ids", "attention_mask"], [2]), rules],
        outputs,
    )


def _rules(source: str = "score", score_output: str | None = None) -> Any:
    from milliserve.config.step_config import Rules

    return Rules(input=source, output="label", labels=("a", "b"), score_output=score_output)
