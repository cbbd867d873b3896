"""The tokenizer step: a text model takes raw strings (a BYTES input) and the server turns
them into token ids and an attention mask with Hugging Face ``tokenizers`` (Rust; a loop
over texts, never over tokens, in Python).

Serves both a model's own ``tokenizer`` config and a pipeline's tokenizer step. A pipeline
that declares the ids (and mask) as optional inputs also takes token ids in place of text:
they are checked and cut to ``max_length`` the same way.

With ``pair_input`` each row is a pair of texts, (``text_input``, ``pair_input``), encoded
as the model's tokenizer.json joins two sequences (BERT: ``[CLS] a [SEP] b [SEP]``, token
types 0 then 1): a cross-encoder's query and document. Over ``max_length`` the pair's second
text (the document) is cut first; only a first text that fills the budget on its own is cut
too (tokenizers' ``longest_first``), so that a pair always keeps some of each.

No text can hurt other clients: each text's size is checked against ``max_text_bytes``
before anything is tokenized (over it: truncated to that many bytes, or refused with
``overflow: refuse``; an empty text is refused with ``allow_empty: false``), and a batch
with more than ``OFFLOAD_BYTES`` of text is tokenized off the event loop, so a large
request delays only itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from milliserve.config.step_config import TokenizerConfig
from milliserve.errors import ConfigError, InvalidInputError
from milliserve.protocol.types import InferTensor
from milliserve.road import Call, Offload, Tensors

__all__ = ["OFFLOAD_BYTES", "TokenizerStep"]

# A batch with more text than this is tokenized off the event loop (~0.1 ms of work).
OFFLOAD_BYTES = 16 * 1024


class TokenizerStep:
    def __init__(
        self, name: str, config: TokenizerConfig, model_dir: Path, offload: Offload | None = None
    ) -> None:
        from tokenizers import Tokenizer

        path = model_dir / config.file
        if not path.is_file():
            raise ConfigError(
                f"tokenizer {path}: no such file (a tokenizer.json from Hugging Face tokenizers)"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise ConfigError(f"tokenizer {path}: cannot load it ({exc})") from None
        self.refuse = config.overflow == "refuse"
        self.pair_input, self.type_ids = config.pair_input, config.type_ids
        if self.refuse:  # a tokenizer.json may truncate on its own (MiniLM's: at 128 tokens)
            self.tokenizer.no_truncation()
        else:
            strategy = "only_second" if self.pair_input else "longest_first"
            self.tokenizer.enable_truncation(config.max_length, strategy=strategy)
        # pairs whose first text leaves no room for the second: cut both, longest first (a
        # second tokenizer, as truncation is the tokenizer's state and a batch may be
        # encoded off the event loop while another is encoded on it)
        self._longest_first: Any = None
        if self.pair_input and not self.refuse:
            self._longest_first = Tokenizer.from_file(str(path))
            self._longest_first.enable_truncation(config.max_length, strategy="longest_first")
            self._longest_first.enable_padding(pad_id=0)
        self.tokenizer.enable_padding(pad_id=0)  # to the longest text of the batch
        self.name, self.stage, self.config = name, "preprocess", config
        self.text_input, self.ids, self.mask = config.text_input, config.ids, config.mask
        self.max_length, self.text_limit = config.max_length, config.text_limit
        self.allow_empty = config.allow_empty
        self.needs: tuple[str, ...] = (self.text_input,) + ((self.pair_input,) if self.pair_input else ())
        self.makes: tuple[str, ...] = tuple(n for n in (self.ids, self.mask, self.type_ids) if n)
        self._offload = offload

    def _texts(self, found: InferTensor, name: str = "") -> tuple[list[str], int]:
        """The request's texts, each checked against the size limit, and their total bytes."""
        name = name or self.text_input
        if found.datatype != "BYTES":
            raise InvalidInputError(f"input {name!r} must be BYTES (UTF-8 text), got {found.datatype}")
        texts: list[str] = []
        total = 0
        limit = self.text_limit
        for i, v in enumerate(np.asarray(found.data).reshape(-1)):
            raw = v if isinstance(v, bytes) else str(v).encode()
            cut = len(raw) > limit
            if cut:
                if self.refuse:
                    raise InvalidInputError(
                        f"input {name!r} element {i} has {len(raw)} bytes of text; this "
                        f"model takes at most {limit} (tokenizer max_text_bytes)"
                    )
                raw = raw[:limit]
            try:
                text = raw.decode()
            except UnicodeDecodeError as exc:
                if not (cut and exc.start >= limit - 3):  # not merely a character cut in two
                    raise InvalidInputError(f"input {name!r} element {i} is not UTF-8 text: {exc}") from None
                text = raw[: exc.start].decode()
            if not self.allow_empty and not text.strip():
                raise InvalidInputError(
                    f"input {name!r} element {i} is empty; this model needs some text "
                    "(tokenizer allow_empty: false)"
                )
            texts.append(text)
            total += len(raw)
        return texts, total

    def _encode_pairs(self, texts: list[str], pairs: list[str], pool: bool) -> list[Any]:
        """Each (text, pair) encoded, the pair cut first; a text that leaves its pair no room
        is cut too (``longest_first``), as tokenizers cannot cut the second text below zero."""
        rows = list(zip(texts, pairs, strict=True))
        tok = self.tokenizer
        if pool:
            try:
                return list(tok.encode_batch(rows))
            except Exception:  # "Truncation error: Second sequence not long enough": one row
                return [self._encode_pair(a, b) for a, b in rows]
        return [self._encode_pair(a, b) for a, b in rows]

    def _encode_pair(self, text: str, pair: str) -> Any:
        try:
            return self.tokenizer.encode(text, pair)
        except Exception:  # tokenizers: "Second sequence not long enough to be truncated"
            if self._longest_first is None:
                raise
            return self._longest_first.encode(text, pair)

    def _encode(
        self, texts: list[str], pool: bool = False, pairs: list[str] | None = None
    ) -> list[InferTensor]:
        """``pool``: tokenizers' rayon pool encodes the texts (a large batch, already off the
        event loop); else each text is encoded in this thread and padded here. The pool wakes
        threads that wait behind the model's ORT threads for a core and spin before they
        sleep: 250 µs a tweet under load against 30 µs here, and 350 against 105 µs of CPU
        for a batch of 4 tweets (the sentiment pipeline, measured)."""
        if pairs is not None:
            enc = self._encode_pairs(texts, pairs, pool)
        else:
            enc = self.tokenizer.encode_batch(texts) if pool else [self.tokenizer.encode(t) for t in texts]
        if self.refuse:
            for i, e in enumerate(enc):
                tokens = sum(e.attention_mask)  # the padding to the longest text aside
                if tokens > self.max_length:
                    what = f"input {self.text_input!r} element {i}"
                    if pairs is not None:
                        what = f"the pair {i} ({self.text_input!r}, {self.pair_input!r})"
                    raise InvalidInputError(
                        f"{what} is {tokens} tokens long; this model takes at most "
                        f"{self.max_length} (tokenizer max_length)"
                    )
        if not self.allow_empty:  # text of zero-width characters alone leaves no token
            for i, e in enumerate(enc):
                if not any(
                    m and not sp for m, sp in zip(e.attention_mask, e.special_tokens_mask, strict=True)
                ):
                    raise InvalidInputError(
                        f"input {self.text_input!r} element {i} has no text the tokenizer keeps; "
                        "this model needs some text (tokenizer allow_empty: false)"
                    )
        types: np.ndarray[Any, Any] | None = None
        # pairs may come back unpadded (a row encoded again after a batch failed): padded here
        if (pool and pairs is None) or len(enc) < 2:
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            if self.type_ids:
                types = np.array([e.type_ids for e in enc], dtype=np.int64)
        else:  # padded to the longest text (pad id 0, mask 0), as encode_batch pads
            longest = max(len(e.ids) for e in enc)
            ids = np.zeros((len(enc), longest), dtype=np.int64)
            mask = np.zeros((len(enc), longest), dtype=np.int64)
            for row, e in enumerate(enc):
                ids[row, : len(e.ids)] = e.ids
                mask[row, : len(e.ids)] = e.attention_mask
            if self.type_ids:
                types = np.zeros((len(enc), longest), dtype=np.int64)
                for row, e in enumerate(enc):
                    types[row, : len(e.ids)] = e.type_ids
        out = [InferTensor(self.ids, "INT64", ids.shape, ids)]
        if self.mask is not None:
            out.append(InferTensor(self.mask, "INT64", mask.shape, mask))
        if self.type_ids and types is not None:
            out.append(InferTensor(self.type_ids, "INT64", types.shape, types))
        return out

    def _given_ids(self, tensors: Tensors) -> None:
        """Token ids the request sent in place of text (a pipeline that declares the ids, and
        the mask, as optional inputs): checked against the vocabulary and ``max_length`` as
        text would be, cut to ``max_length`` unless overflow is ``refuse``."""
        ids = np.asarray(tensors[self.ids].data)
        given = tensors.get(self.mask) if self.mask else None
        mask = np.asarray(given.data) if given is not None else np.ones_like(ids)
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise InvalidInputError(
                f"input {self.ids!r} has shape {list(ids.shape)} and {self.mask!r} {list(mask.shape)}: "
                "token ids come as [batch, tokens] with a mask of the same shape"
            )
        vocab = self.tokenizer.get_vocab_size()
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = int(ids.reshape(-1)[(ids.reshape(-1) < 0) | (ids.reshape(-1) >= vocab)][0])
            raise InvalidInputError(
                f"input {self.ids!r} holds the token id {bad}; this model's are 0..{vocab - 1}"
            )
        lengths = np.count_nonzero(mask, axis=1)
        if not self.allow_empty and ids.shape[0] and lengths.min() == 0:
            raise InvalidInputError(
                f"input {self.ids!r} element {int(lengths.argmin())} has no token; this model needs some"
            )
        if ids.shape[1] > self.max_length:
            if self.refuse and lengths.max() > self.max_length:
                raise InvalidInputError(
                    f"input {self.ids!r} element {int(lengths.argmax())} is {int(lengths.max())} tokens "
                    f"long; this model takes at most {self.max_length} (tokenizer max_length)"
                )
            ids, mask = ids[:, : self.max_length], mask[:, : self.max_length]
        tensors[self.ids] = InferTensor(self.ids, "INT64", ids.shape, ids.astype(np.int64, copy=False))
        if self.mask:
            m = mask.astype(np.int64, copy=False)
            tensors[self.mask] = InferTensor(self.mask, "INT64", m.shape, m)

    async def run(self, tensors: Tensors, call: Call) -> None:
        found = tensors.get(self.text_input)
        if found is None:
            if self.ids in tensors and not self.pair_input:
                self._given_ids(tensors)
                return
            raise InvalidInputError(
                f"this model takes raw text: the request needs the BYTES input {self.text_input!r}"
            )
        texts, total = self._texts(found)
        pairs: list[str] | None = None
        if self.pair_input:
            second = tensors.get(self.pair_input)
            if second is None:
                raise InvalidInputError(
                    f"this model scores pairs of texts: the request needs the BYTES input "
                    f"{self.pair_input!r} beside {self.text_input!r}"
                )
            pairs, more = self._texts(second, self.pair_input)
            if len(pairs) != len(texts):
                raise InvalidInputError(
                    f"inputs {self.text_input!r} and {self.pair_input!r} hold {len(texts)} and "
                    f"{len(pairs)} texts; a pair needs one of each"
                )
            total += more
        made: Any
        if total > OFFLOAD_BYTES and self._offload is not None:
            made = await self._offload(self._encode, texts, True, pairs)
        else:
            made = self._encode(texts, False, pairs)
        for t in made:
            tensors[t.name] = t
