"""The example builders: real weights, no downloads, and outputs checked against references."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from milliserve.examples.build import build_examples
from milliserve.examples.fraud_mlp import synthetic_transactions
from milliserve.examples.minilm import minilm_dir


def test_fraud_mlp_learns_better_than_the_base_rate(example_repo: Path) -> None:
    x, y = synthetic_transactions(4000, seed=7)
    s = ort.InferenceSession(str(example_repo / "fraud_mlp" / "1" / "model.onnx"))
    probs = s.run(None, {"features": x})[0]
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    accuracy = float((probs.argmax(1) == y).mean())
    assert accuracy > max(y.mean(), 1 - y.mean()) + 0.05


def test_minilm_onnx_matches_transformers(example_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    model = BertModel.from_pretrained(str(minilm_dir())).eval()
    enc = tok(
        ["fraud checks must be fast", "a much longer sentence about the weather in spring"],
        padding=True,
        return_tensors="np",
    )
    with torch.no_grad():
        hidden = model(
            input_ids=torch.tensor(enc["input_ids"]), attention_mask=torch.tensor(enc["attention_mask"])
        ).last_hidden_state.numpy()
    mask = enc["attention_mask"][:, :, None].astype(np.float32)
    ref = (hidden * mask).sum(1) / mask.sum(1)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    s = ort.InferenceSession(str(example_repo / "minilm" / "1" / "model.onnx"))
    got = s.run(
        None,
        {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
        },
    )[0]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_unknown_example_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown examples \\['bert'\\]"):
        build_examples(tmp_path, ["bert"])


def test_smollm2_comes_from_the_installed_package(llm_repo: Path) -> None:
    """`milliserve examples build` puts the packaged GGUF in with a llama_cpp config."""
    from milliserve.config.model_config import load_model_config
    from milliserve.examples.smollm2 import packaged_gguf

    gguf = llm_repo / "smollm2" / "1" / "model.gguf"
    assert gguf.resolve() == packaged_gguf()
    cfg = load_model_config(llm_repo / "smollm2")
    assert cfg is not None and cfg.backend == "llama_cpp"
    assert cfg.budget is not None and cfg.budget.ttft_ms == 1000
