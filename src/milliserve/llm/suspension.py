"""Sequences suspended by preemption (llm/admission.py's ``Preemption``): each one's KV
saved to host memory, up to a cap, until it takes a slot again. Read from the event loop
too (``len``, ``in``): snapshots, no lock."""

from __future__ import annotations

from milliserve.llm.sequence import GenRequest, Sequence
from milliserve.llm.token_model import TokenModel

__all__ = ["Suspended"]


class Suspended:
    """The suspended sequences by request, and the host memory their KV holds."""

    def __init__(self, max_bytes: int) -> None:
        self._held: dict[GenRequest, Sequence] = {}
        self.bytes = 0
        # suspended sequences' KV is held in host memory up to this (then nothing is suspended)
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, req: object) -> bool:
        return req in self._held

    def hold(self, s: Sequence, data: bytes) -> bool:
        """Keep ``s`` with its saved KV ``data``; False (nothing kept) when there is none or
        it would take the held bytes past the cap."""
        if not data or self.bytes + len(data) > self.max_bytes:
            return False
        self.bytes += len(data)
        s.saved = data
        self._held[s.req] = s
        return True

    def take(self, req: GenRequest) -> tuple[Sequence, bytes] | None:
        """The suspended sequence of ``req`` and its saved KV, let go of; None if it has none."""
        s = self._held.pop(req, None)
        if s is None:
            return None
        data, s.saved = s.saved, b""
        self.bytes -= len(data)
        return s, data

    def drop(self, req: GenRequest, model: TokenModel) -> None:
        """Let go of ``req``'s suspended sequence, if any (its client left), and its sampler."""
        taken = self.take(req)
        if taken is not None:
            model.free_sampler(taken[0].sampler)

    def clear(self, model: TokenModel) -> None:
        """Let go of every suspended sequence (the engine stops)."""
        for s in self._held.values():
            model.free_sampler(s.sampler)
        self._held.clear()
