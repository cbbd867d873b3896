"""The score step (pipeline/score.py), the pair tokenizer (features/tokenize.py with
``pair_input``) and how a reranking pipeline is wired: it batches, and its cross-encoder
runs length buckets whose rows come back in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from milliserve.config.model_config import ModelConfig
from milliserve.config.step_config import PipelineStep, Score, TokenizerConfig
from milliserve.errors import InvalidInputError
from milliserve.examples.minilm import tokenizer_path
from milliserve.features.tokenize import TokenizerStep
from milliserve.pipeline.batching import batching_wanted
from milliserve.pipeline.ensemble import _length_buckets
from milliserve.pipeline.score import ScoreStep, activate
from milliserve.pipeline.steps import ModelCall, tensor
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.road import Call


def _call(**parameters: Any) -> Call:
    return Call(InferRequest("m", "", [], parameters=parameters))


def _texts(values: list[str]) -> Any:
    data = np.array([[v.encode()] for v in values], dtype=object)
    return tensor("x", data)


def test_activations() -> None:
    x = np.array([[0.0], [2.0], [-800.0]], dtype=np.float32)
    np.testing.assert_allclose(activate(x, "sigmoid")[:, 0], [0.5, 1 / (1 + np.exp(-2.0)), 0.0], rtol=1e-6)
    soft = activate(np.array([[1.0, 2.0, 3.0]]), "softmax")
    np.testing.assert_allclose(soft.sum(), 1.0, rtol=1e-6)
    assert soft.argmax() == 2 and activate(x, "none") is not None


def test_score_step_raw_scores_and_tokens() -> None:
    step = ScoreStep("s", Score(input="logits", activation="sigmoid", output="score", tokens="tokens"))
    logits = np.array([[0.0], [1.0]], dtype=np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64)

    def run(call: Call) -> dict[str, Any]:
        tensors = {"logits": tensor("logits", logits), "attention_mask": tensor("attention_mask", mask)}
        asyncio.run(step.run(tensors, call))
        return {k: np.asarray(v.data) for k, v in tensors.items()}

    out = run(_call())
    np.testing.assert_allclose(out["score"][:, 0], [0.5, 1 / (1 + np.exp(-1.0))], rtol=1e-6)
    assert out["tokens"].tolist() == [[3], [4]]
    np.testing.assert_array_equal(run(_call(raw_scores=True))["score"], logits)
    with pytest.raises(InvalidInputError, match="'raw_scores'"):
        run(_call(raw_scores="yes"))


def _pair_tokenizer(tmp_path: Path, max_length: int = 16, **kw: Any) -> TokenizerStep:
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path().read_bytes())
    config = TokenizerConfig(
        file="tokenizer.json",
        text_input="Q",
        pair_input="D",
        type_ids="token_type_ids",
        max_length=max_length,
        **kw,
    )
    return TokenizerStep("step 1", config, tmp_path)


def test_pairs_are_one_sequence_and_the_second_text_is_cut_first(tmp_path: Path) -> None:
    tok = _pair_tokenizer(tmp_path)
    assert tok.needs == ("Q", "D") and tok.makes == ("input_ids", "attention_mask", "token_type_ids")
    long_doc = " ".join(["car"] * 40)
    tensors = {"Q": _texts(["good", "a b c d e f g h i j k l m n o p q r"]), "D": _texts([long_doc, "x"])}
    asyncio.run(tok.run(tensors, _call()))
    ids = np.asarray(tensors["input_ids"].data)
    types = np.asarray(tensors["token_type_ids"].data)
    mask = np.asarray(tensors["attention_mask"].data)
    assert ids.shape == (2, 16) and mask.sum(1).tolist() == [16, 16]
    # [CLS] good [SEP] car ... [SEP]: the query whole, the document cut
    assert ids[0, :3].tolist() == [101, 2204, 102] and ids[0, -1] == 102
    assert types[0].tolist() == [0, 0, 0] + [1] * 13
    # a query that leaves no room: both cut, longest first; the document keeps a token
    assert 1 in types[1].tolist()
    with pytest.raises(InvalidInputError, match="'D'"):
        asyncio.run(tok.run({"Q": _texts(["a"])}, _call()))
    with pytest.raises(InvalidInputError, match="hold 2 and 1"):
        asyncio.run(tok.run({"Q": _texts(["a", "b"]), "D": _texts(["c"])}, _call()))


def test_refused_pair_names_it(tmp_path: Path) -> None:
    tok = _pair_tokenizer(tmp_path, overflow="refuse")
    with pytest.raises(InvalidInputError, match=r"the pair 0 \('Q', 'D'\) is \d+ tokens long"):
        asyncio.run(tok.run({"Q": _texts(["a"]), "D": _texts(["car " * 30])}, _call()))


def test_reranking_pipeline_batches_and_buckets(tmp_path: Path) -> None:
    """The cross-encoder's logits (no token axis, read by a score step) from a model that
    reads the mask: the pipeline batches, and the model step runs length buckets whose rows
    are put back in order."""
    tok = _pair_tokenizer(tmp_path, 128)
    inputs = ["input_ids", "attention_mask", "token_type_ids"]
    config = ModelConfig.model_validate(
        {
            "name": "cross",
            "backend": "onnxruntime",
            "max_batch_size": 32,
            "input": [{"name": n, "data_type": "TYPE_INT64", "dims": [-1]} for n in inputs],
            "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [1]}],
        }
    )
    seen: list[int] = []

    class Model:
        def __init__(self) -> None:
            self.config = config

        async def infer(self, request: InferRequest) -> InferResponse:
            ids = np.asarray(request.inputs[0].data)
            seen.append(ids.shape[1])
            # a row's "logit": its first token id after [CLS], which padding cannot change
            logits = ids[:, 1:2].astype(np.float32)
            return InferResponse("cross", "1", [tensor("logits", logits)])

    model = ModelCall(
        "step 2 (model cross)", PipelineStep(model_name="cross"), inputs, ["logits"], lambda m, v: Model()
    )
    score = ScoreStep("step 3", Score(activation="none"))
    assert batching_wanted({}, 32, [tok, model, score], ["score", "tokens"])
    _length_buckets([tok, model, score], {"score", "tokens"})
    assert model.buckets == ("attention_mask", "logits") and model.rows_out
    words = [" ".join(["w"] * n) for n in range(1, 33)]
    rng = np.random.default_rng(0)
    order = rng.permutation(32)
    queries = [["hello", "world", "car", "road"][i % 4] for i in order]
    tensors = {"Q": _texts(queries), "D": _texts([words[i] for i in order])}
    call = _call()
    asyncio.run(tok.run(tensors, call))
    first_token = np.asarray(tensors["input_ids"].data)[:, 1].copy()
    asyncio.run(model.run(tensors, call))
    asyncio.run(score.run(tensors, call))
    assert len(seen) > 1 and len(set(seen)) > 1  # runs of different widths
    np.testing.assert_array_equal(np.asarray(tensors["score"].data)[:, 0], first_token)
