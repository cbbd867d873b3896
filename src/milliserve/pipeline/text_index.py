"""``milliserve index build``: texts to embeddings to an ANN index, offline.

The texts are embedded by the same encoder and tokenizer that the server runs: the
repository's model (``<repo>/<model>/<latest version>/model.onnx``) with ONNX Runtime in
process, and the ``tokenizer.json`` its pipeline (or its own ``tokenizer`` config) names.
Texts of similar length are batched together, so padding costs little; with mean pooling
over the attention mask the embeddings match the served ones to float rounding.

Texts come from a text file, one per line, or a CSV column. Empty (or whitespace-only)
texts are skipped. Duplicates are kept once, at their first position: a search over
copies would return the same text k times; the id of a text is its line or row number
(0-based, counting the skipped ones), so an id leads back to the source file.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.config.model_config import ModelConfig, load_model_config
from milliserve.errors import ConfigError
from milliserve.pipeline.ann_index import AnnIndex, HnswParams, Metric

__all__ = ["Encoder", "Texts", "build_text_index", "find_encoder", "read_texts"]

Advance = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Texts:
    """Distinct non-empty texts and their ids (line or row number in the source)."""

    texts: list[str]
    ids: np.ndarray[Any, Any]
    skipped_empty: int
    skipped_duplicates: int


def read_texts(path: Path, column: str | None = None, limit: int | None = None) -> Texts:
    """The texts of ``path``: one per line, or the CSV column ``column``. Raises ConfigError
    for a missing file or column, and when no text is left."""
    if not path.is_file():
        raise ConfigError(f"texts file {path}: no such file")
    with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
        if column is None:
            raw = [line.rstrip("\r\n") for line in f]
        else:
            reader = csv.DictReader(f)
            if column not in (reader.fieldnames or ()):
                raise ConfigError(f"{path}: no column {column!r} (columns: {reader.fieldnames})")
            raw = [row[column] or "" for row in reader]
    seen: set[str] = set()
    texts: list[str] = []
    ids: list[int] = []
    empty = dup = 0
    for i, text in enumerate(raw):
        text = text.strip()
        if not text:
            empty += 1
        elif text in seen:
            dup += 1
        else:
            seen.add(text)
            texts.append(text)
            ids.append(i)
            if limit is not None and len(texts) >= limit:
                break
    if not texts:
        raise ConfigError(f"{path}: no text to index ({empty} empty lines)")
    return Texts(texts, np.array(ids, dtype=np.int64), empty, dup)


class Encoder:
    """An ONNX text encoder (token ids and attention mask in, one vector per text out) with
    its tokenizer, run in process."""

    def __init__(
        self,
        model_path: Path,
        tokenizer_path: Path,
        max_length: int = 128,
        output: str | None = None,
        threads: int = 2,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.model_path, self.tokenizer_path = model_path, tokenizer_path
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()  # a tokenizer.json may pad to a fixed length; batches pad below
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        unknown = sorted(set(self.inputs) - {"input_ids", "attention_mask", "token_type_ids"})
        if "input_ids" not in self.inputs or unknown:
            raise ConfigError(
                f"{model_path}: an encoder takes input_ids (and attention_mask, token_type_ids); "
                f"this model takes {self.inputs}"
            )
        outputs = [o.name for o in self.session.get_outputs()]
        self.output = output or outputs[0]
        if self.output not in outputs:
            raise ConfigError(f"{model_path}: no output {self.output!r} (outputs: {outputs})")

    def encode(self, texts: Sequence[str], batch_size: int = 64, advance: Advance | None = None) -> Any:
        """FP32 [len(texts), dim], in the order of ``texts``."""
        enc = self.tokenizer.encode_batch(list(texts))
        lengths = np.array([len(e.ids) for e in enc])
        order = np.argsort(lengths, kind="stable")
        out: np.ndarray[Any, Any] | None = None
        for start in range(0, len(enc), batch_size):
            idx = order[start : start + batch_size]
            width = int(lengths[idx].max())
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, j in enumerate(idx):
                n = lengths[j]
                ids[row, :n] = enc[j].ids
                mask[row, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            (vectors,) = self.session.run([self.output], {n: feeds[n] for n in self.inputs})
            if vectors.ndim != 2:
                raise ConfigError(
                    f"{self.model_path}: output {self.output!r} has shape {list(vectors.shape)}; an "
                    "index needs one vector per text ([batch, dim])"
                )
            if out is None:
                out = np.empty((len(enc), vectors.shape[1]), dtype=np.float32)
            out[idx] = vectors
            if advance is not None:
                advance(len(idx))
        assert out is not None
        return out


def _latest_model_file(model_dir: Path) -> Path:
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    for v in reversed(versions):
        path = model_dir / str(v) / "model.onnx"
        if path.is_file():
            return path
    raise ConfigError(f"{model_dir}: no <version>/model.onnx (an index is built with an ONNX encoder)")


def _tokenizer_of(config: ModelConfig | None, model: str, model_dir: Path) -> tuple[Path, int] | None:
    """The tokenizer file and max_length of a model's own config, or of a pipeline running it."""
    if config is None:
        return None
    if config.tokenizer is not None and config.name == model:
        return model_dir / config.tokenizer.file, config.tokenizer.max_length
    steps = config.ensemble_scheduling.step if config.ensemble_scheduling is not None else ()
    if any(s.model_name == model for s in steps):
        tok = next((s.tokenizer for s in steps if s.tokenizer is not None), None)
        if tok is not None:
            return model_dir / tok.file, tok.max_length
    return None


def find_encoder(repo: Path, model: str, tokenizer: Path | None = None, output: str | None = None) -> Encoder:
    """The encoder ``model`` of ``repo`` with its tokenizer: ``tokenizer`` if given, else the
    model's own tokenizer config, else the tokenizer step of a pipeline that runs the model,
    else ``<repo>/<model>/tokenizer.json``. Raises ConfigError naming what was looked for."""
    model_dir = repo / model
    if not model_dir.is_dir():
        raise ConfigError(f"model repository {repo} has no model {model!r}")
    path = _latest_model_file(model_dir)
    if tokenizer is not None:
        return Encoder(path, tokenizer, output=output)
    found = _tokenizer_of(load_model_config(model_dir), model, model_dir)
    for other in sorted(p for p in repo.iterdir() if p.is_dir() and p != model_dir):
        if found is not None:
            break
        try:
            found = _tokenizer_of(load_model_config(other), model, other)
        except ConfigError:
            continue  # another model's broken config is not this command's concern
    if found is None and (model_dir / "tokenizer.json").is_file():
        found = (model_dir / "tokenizer.json", 128)
    if found is None:
        raise ConfigError(
            f"no tokenizer for {model!r}: none in its config, no pipeline in {repo} runs it after a "
            f"tokenizer step, and no {model_dir / 'tokenizer.json'}; pass --tokenizer"
        )
    return Encoder(path, found[0], max_length=found[1], output=output)


def build_text_index(
    texts: Texts,
    encoder: Encoder,
    output: Path,
    params: HnswParams | None = None,
    model: str = "",
    advance: Advance | None = None,
    metric: Metric = "ip",
) -> AnnIndex:
    """Embed ``texts`` with ``encoder``, build the index and save it at ``output`` (with its
    sidecars). ``advance(n)`` is called as texts are embedded."""
    vectors = encoder.encode(texts.texts, advance=advance)
    index = AnnIndex.build(vectors, texts.texts, texts.ids, params or HnswParams(), metric, model)
    index.save(output)
    return index
