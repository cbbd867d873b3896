"""OpenAI's ``POST /v1/embeddings`` body and answer, transport-free.

``input`` is a string, a list of strings, a list of token ids or a list of such lists (at
most 2048 inputs, OpenAI's limit); ``encoding_format`` ``float`` (default) or ``base64``
(little-endian float32, what the ``openai`` SDK asks for by default); ``dimensions`` a
smaller size where the model allows it; ``embedding_type`` ``float`` (default), ``int8``,
``uint8``, ``binary`` or ``ubinary`` (infinity's types, quantized as
``runtime/embedding_types.py`` says: integers in JSON, the raw bytes in base64); ``user`` is
accepted and has no effect. Any other field is refused with ``InvalidInputError`` (a 400)
that names it, as OpenAI does.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError
from milliserve.protocol.json_codec import encode_json
from milliserve.runtime.embedding_types import EMBEDDING_TYPES

__all__ = ["MAX_INPUTS", "EmbeddingsRequest", "embeddings_response", "parse_embeddings"]

MAX_INPUTS = 2048
_FIELDS = ("model", "input", "encoding_format", "dimensions", "embedding_type", "user")


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    inputs: list[str] | list[list[int]]
    base64: bool
    dimensions: int | None
    embedding_type: str = "float"


def _bad(message: str, param: str) -> InvalidInputError:
    return InvalidInputError(message, param)


def _token_list(value: list[Any], where: str) -> list[int]:
    if not value:
        raise _bad(f"{where} is an empty list of token ids", "input")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**31:
            raise _bad(f"{where} holds {v!r}; token ids are integers from 0", "input")
    return value


def _inputs(raw: Any) -> list[str] | list[list[int]]:
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        what = "an empty list" if isinstance(raw, list) else type(raw).__name__
        raise _bad(
            f"'input' is {what}; give a string, a list of strings, a list of token ids or a list "
            "of lists of token ids",
            "input",
        )
    if len(raw) > MAX_INPUTS:
        raise _bad(f"'input' has {len(raw)} items; at most {MAX_INPUTS} go in one request", "input")
    first = raw[0]
    if isinstance(first, str):
        for i, v in enumerate(raw):
            if not isinstance(v, str):
                raise _bad(f"'input' mixes strings and {type(v).__name__} (item {i})", "input")
        return raw
    if isinstance(first, int) and not isinstance(first, bool):
        return [_token_list(raw, "'input'")]
    if isinstance(first, list):
        out = []
        for i, v in enumerate(raw):
            if not isinstance(v, list):
                raise _bad(f"'input' mixes lists of token ids and {type(v).__name__} (item {i})", "input")
            out.append(_token_list(v, f"'input' item {i}"))
        return out
    raise _bad(f"'input' holds {type(first).__name__}; give strings or token ids", "input")


def parse_embeddings(doc: dict[str, Any]) -> EmbeddingsRequest:
    """The request, checked; InvalidInputError (400) naming the offending field."""
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise _bad(f"unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: the name of an embedding model (GET /v1/models)", "model")
    if "input" not in doc:
        raise _bad("'input' is required", "input")
    fmt = doc.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise _bad(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    dims = doc.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise _bad(f"'dimensions' must be a positive integer, got {dims!r}", "dimensions")
    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad(f"'user' must be a string, got {type(user).__name__}", "user")
    kind = doc.get("embedding_type", "float")
    kind = "float" if kind == "float32" else kind  # infinity spells it float32
    if kind not in EMBEDDING_TYPES:
        raise _bad(
            f"'embedding_type' must be one of {', '.join(EMBEDDING_TYPES)}, got {kind!r}", "embedding_type"
        )
    return EmbeddingsRequest(model, _inputs(doc["input"]), fmt == "base64", dims, kind)


def embeddings_response(model: str, vectors: np.ndarray[Any, Any], tokens: int, b64: bool) -> bytes:
    """OpenAI's answer: one embedding per row of ``vectors``, in order: float32 vectors as
    floats, or as little-endian float32 bytes in base64; int8 or uint8 ones (compact
    embedding types) as integers, or their bytes in base64."""
    if b64:
        rows = vectors.astype("<f4", copy=False) if vectors.dtype.kind == "f" else vectors
        items: list[Any] = [base64.b64encode(r.tobytes()).decode("ascii") for r in rows]
    elif vectors.dtype.kind == "f":
        items = list(np.ascontiguousarray(vectors, dtype=np.float32))
    else:
        items = vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return encode_json({"object": "list", "data": data, "model": model, "usage": usage})
