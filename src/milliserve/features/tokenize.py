"""The tokenizer step: a text model takes raw strings (a BYTES input) and the server turns
them into token ids and an attention mask with Hugging Face ``tokenizers`` (Rust, the
whole batch in one call), never a Python loop over tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from milliserve.errors import ConfigError, InvalidInputError
from milliserve.protocol.types import InferTensor

__all__ = ["TokenizerStep"]


class TokenizerStep:
    def __init__(self, path: Path, text_input: str, ids: str, mask: str | None, max_length: int) -> None:
        from tokenizers import Tokenizer

        if not path.is_file():
            raise ConfigError(
                f"tokenizer {path}: no such file (a tokenizer.json from Hugging Face tokenizers)"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise ConfigError(f"tokenizer {path}: cannot load it ({exc})") from None
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(pad_id=0)  # to the longest text of the batch
        self.text_input, self.ids, self.mask = text_input, ids, mask

    def apply(self, inputs: list[InferTensor]) -> list[InferTensor]:
        """Replace the text input by the token ids (and mask) tensors, INT64 [batch, tokens]."""
        found = next((t for t in inputs if t.name == self.text_input), None)
        if found is None:
            raise InvalidInputError(
                f"this model takes raw text: the request needs the BYTES input {self.text_input!r}"
            )
        if found.datatype != "BYTES":
            raise InvalidInputError(
                f"input {self.text_input!r} must be BYTES (UTF-8 text), got {found.datatype}"
            )
        try:
            texts = [
                v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(found.data).reshape(-1)
            ]
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"input {self.text_input!r} is not UTF-8 text: {exc}") from None
        enc = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        out: list[Any] = [t for t in inputs if t.name != self.text_input]
        out.append(InferTensor(self.ids, "INT64", ids.shape, ids))
        if self.mask is not None:
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            out.append(InferTensor(self.mask, "INT64", mask.shape, mask))
        return out
