"""The token-level operations the generation engine uses, as a protocol: only
``backends/llama_cpp.py`` calls llama.cpp (its ``LlamaModel`` implements this), and the
engine's unit tests drive it with a scripted model."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["TokenModel"]


class TokenModel(Protocol):
    """The token-level operations the engine uses (``backends.llama_cpp.LlamaModel``)."""

    n_ctx_seq: int
    batch_capacity: int
    threads: tuple[int, int]

    def set_threads(self, n: int, n_batch: int) -> None: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> bool: ...

    interruptible: bool

    def interrupt(self, stop: bool = True) -> None: ...

    def new_sampler(self, spec: Any) -> Any: ...

    def accept(self, sampler: Any, token: int) -> None: ...

    def sample(self, sampler: Any, index: int) -> int: ...

    def free_sampler(self, sampler: Any) -> None: ...

    def seq_remove(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_copy(self, src: int, dst: int, keep: int) -> None: ...

    def save_seq(self, seq: int) -> bytes: ...

    def load_seq(self, seq: int, data: bytes) -> bool: ...
