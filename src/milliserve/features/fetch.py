"""The feature step: entity ids in (a BYTES input, or a request parameter), the feature
tensor out, fetched from the in-process table or Redis (``features/store.py``).

Serves both a model's own ``features`` config and a pipeline's features step. A Redis
lookup waits no longer than the budget's ``features`` stage allows, nor past the
request's deadline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milliserve.errors import InvalidInputError
from milliserve.features.store import FeatureSet
from milliserve.protocol.types import InferTensor
from milliserve.road import BatchCall, Call, Tensors

__all__ = ["MAX_ENTITY_ID_BYTES", "FetchFeatures", "entity_ids"]

MAX_ENTITY_ID_BYTES = 256


def _missing(what: str) -> InvalidInputError:
    return InvalidInputError(f"this model fetches features by entity id: the request needs the {what}")


def _id(value: Any, where: str) -> str:
    if isinstance(value, bytes):
        if len(value) > MAX_ENTITY_ID_BYTES:
            raise InvalidInputError(
                f"{where} is {len(value)} bytes long; ids are at most {MAX_ENTITY_ID_BYTES}"
            )
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"{where} is not UTF-8 text: {exc}") from None
    text = str(value)
    if len(text) > MAX_ENTITY_ID_BYTES:
        raise InvalidInputError(
            f"{where} is {len(text)} characters long; ids are at most {MAX_ENTITY_ID_BYTES}"
        )
    return text


def entity_ids(features: FeatureSet, tensors: Tensors, parameters: dict[str, Any]) -> list[str]:
    """The entity ids a request names, checked (UTF-8, bounded length)."""
    if features.entity_input is not None:
        found = tensors.get(features.entity_input)
        if found is None:
            raise _missing(f"input {features.entity_input!r} with the entity ids")
        ids = np.asarray(found.data).reshape(-1).tolist()
        try:  # the common case: every id short UTF-8 bytes, checked without naming each
            if all(type(v) is bytes and len(v) <= MAX_ENTITY_ID_BYTES for v in ids):
                return [v.decode() for v in ids]
        except UnicodeDecodeError:
            pass
        name = features.entity_input
        return [_id(v, f"entity id {i} of input {name!r}") for i, v in enumerate(ids)]
    value = parameters.get(features.entity_parameter or "")
    if value is None or isinstance(value, bool):
        raise _missing(f"parameter {features.entity_parameter!r} with the entity id")
    return [_id(value, f"parameter {features.entity_parameter!r}")]


class FetchFeatures:
    def __init__(self, name: str, features: FeatureSet) -> None:
        self.name, self.stage, self.features = name, "features", features
        self.needs: tuple[str, ...] = (features.entity_input,) if features.entity_input else ()
        self.makes: tuple[str, ...] = (features.input,)
        # ids read per row of a tensor can serve a batch of requests; one id in a request
        # parameter cannot
        self.rowwise = features.entity_input is not None

    async def run(self, tensors: Tensors, call: Call) -> None:
        f = self.features
        ids = entity_ids(f, tensors, call.request.parameters)
        if isinstance(call, BatchCall):  # several clients' rows: each told of its own
            values, unknown, unavailable = await f.assemble_rows(ids, deadline=call.deadline)
            if unavailable or unknown.any():
                per_row = len(ids) // max(sum(call.parts), 1)
                for notes, (start, end) in zip(call.part_notes, call.spans(per_row), strict=True):
                    notes.update(f.notes(int(unknown[start:end].sum()), unavailable))
        else:
            values, told = await f.assemble(ids, deadline=call.deadline)
            call.notes.update(told)
        tensors[f.input] = InferTensor(f.input, "FP32", values.shape, values)

    async def close(self) -> None:
        await self.features.close()
