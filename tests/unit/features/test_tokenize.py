"""The tokenizer step's limits: each text's size is checked before it is tokenized (cut, or
refused with ``overflow: refuse``), a text over max_length tokens is cut or refused, a
character split by the cut is dropped, invalid UTF-8 is a 400 naming the element, and a
large batch is tokenized through the offload function (off the event loop)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from milliserve.config.step_config import TokenizerConfig
from milliserve.errors import InvalidInputError
from milliserve.examples.minilm import tokenizer_path
from milliserve.features.tokenize import OFFLOAD_BYTES, TokenizerStep
from milliserve.protocol.types import InferRequest, InferTensor
from milliserve.road import Call


def _step(tmp_path: Path, offload: Any = None, **config: Any) -> TokenizerStep:
    shutil.copy(tokenizer_path(), tmp_path / "tokenizer.json")
    cfg = TokenizerConfig.model_validate({"file": "tokenizer.json", "text_input": "TEXT", **config})
    return TokenizerStep("tokenizer", cfg, tmp_path, offload)


def _run(step: TokenizerStep, *texts: bytes) -> dict[str, InferTensor]:
    data = np.array([[t] for t in texts], dtype=object)
    tensors = {"TEXT": InferTensor("TEXT", "BYTES", data.shape, data)}
    asyncio.run(step.run(tensors, Call(InferRequest("m", "", []))))
    return tensors


def test_long_texts_are_cut_to_max_length_tokens(tmp_path: Path) -> None:
    out = _run(_step(tmp_path, max_length=16), b"word " * 1000, b"short")
    ids, mask = out["input_ids"].data, out["attention_mask"].data
    assert ids.shape == (2, 16) and mask[1].sum() < 16  # padded to the longest, no longer


def test_a_text_over_the_byte_limit_is_cut_before_tokenizing(tmp_path: Path) -> None:
    step = _step(tmp_path, max_length=512, max_text_bytes=100)
    assert step.text_limit == 100
    out = _run(step, b"word " * 1_000_000)  # 5 MB: only its first 100 bytes are tokenized
    assert out["input_ids"].shape[1] <= 100
    # cut in the middle of a character: the broken tail is dropped, not an error
    out = _run(step, "é".encode() * 60)
    assert out["input_ids"].shape[0] == 1


def test_the_default_byte_limit_follows_max_length(tmp_path: Path) -> None:
    assert _step(tmp_path, max_length=128).text_limit == 64 * 128


def test_refuse_names_the_element_and_the_limit(tmp_path: Path) -> None:
    step = _step(tmp_path, max_length=8, overflow="refuse")
    _run(step, b"a short one")
    with pytest.raises(InvalidInputError, match=r"element 1 is \d+ tokens long; this model takes at most 8"):
        _run(step, b"fine", b"this text is certainly longer than eight tokens in total")
    with pytest.raises(
        InvalidInputError, match="element 0 has 600 bytes of text; this model takes at most 512"
    ):
        _run(step, b"x" * 600)


def test_invalid_utf8_is_a_400_naming_the_element(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="element 1 is not UTF-8 text"):
        _run(_step(tmp_path), b"fine", b"\xff\xfe bad")


def test_a_large_batch_is_tokenized_through_the_offload(tmp_path: Path) -> None:
    calls: list[int] = []

    async def offload(fn: Any, *args: Any) -> Any:
        calls.append(len(args[0]))
        return fn(*args)

    step = _step(tmp_path, offload=offload, max_length=32)
    _run(step, b"tiny", b"texts")
    assert calls == []  # a few bytes: tokenized in place, cheaper than a hand-off
    _run(step, *([b"some words " * 40] * (OFFLOAD_BYTES // 400 + 2)))
    assert len(calls) == 1


def test_allow_empty_false_refuses_an_empty_or_blank_text(tmp_path: Path) -> None:
    assert _run(_step(tmp_path), b"")["input_ids"].shape == (1, 2)  # by default: [CLS] [SEP]
    step = _step(tmp_path, allow_empty=False)
    _run(step, b"a query")
    for blank in (b"", b"  \t"):
        with pytest.raises(InvalidInputError, match=r"element 1 is empty; .*allow_empty: false"):
            _run(step, b"fine", blank)
    # text the tokenizer drops entirely (zero-width characters, a control character) leaves
    # only the special tokens: as empty as an empty string
    for invisible in ("\u200b\u200b", "\u200d", "\u200b \ufeff", "\x00"):
        with pytest.raises(
            InvalidInputError, match=r"element 1 has no text the tokenizer keeps; .*allow_empty"
        ):
            _run(step, b"fine", invisible.encode())
    _run(step, "caf\u00e9 \u200b".encode())  # visible text beside them is fine


class _NoPool:
    """The step's tokenizer, with its rayon-pool ``encode_batch`` taken away."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> Any:
        return self._tokenizer.encode(text)

    def encode_batch(self, texts: list[str]) -> Any:
        raise AssertionError("a small batch must not wake tokenizers' thread pool")


def test_a_small_batch_is_encoded_text_by_text_and_padded_as_encode_batch_pads(tmp_path: Path) -> None:
    texts = [
        "short",
        "a somewhat longer tweet about the weather, which was lovely today!! 🌞🌞",
        "Ünïcödé àccents and ＦＵＬＬＷＩＤＴＨ letters",
        "word " * 200,  # cut at max_length
        "two words",
    ]
    step = _step(tmp_path, max_length=24)
    reference = step.tokenizer.encode_batch(texts)  # padded to the longest, pad id 0
    step.tokenizer = _NoPool(step.tokenizer)
    out = _run(step, *(t.encode() for t in texts))
    assert out["input_ids"].shape == (5, 24)
    np.testing.assert_array_equal(out["input_ids"].data, [e.ids for e in reference])
    np.testing.assert_array_equal(out["attention_mask"].data, [e.attention_mask for e in reference])
    assert out["input_ids"].data.dtype == np.int64 and out["attention_mask"].data.dtype == np.int64
