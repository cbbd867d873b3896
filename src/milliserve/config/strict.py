"""The base of every config schema: unknown fields are errors, values are immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Strict"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
