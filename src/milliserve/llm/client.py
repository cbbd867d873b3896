"""What the front ends need of a generative model, declared: ``EngineClient``.

The OpenAI routes, Triton's generate extension and the data plane depend on this
protocol, not on the engine behind it (as vLLM's front ends depend on its
``EngineClient``). ``GenerativeServable`` (llm/generative_servable.py) implements it over the
continuous-batching engine; another engine (a llama.cpp server process, a remote one)
would implement the same five members. gRPC's decoupled streaming goes through the
servable protocol's ``stream``, as every model's does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from milliserve.config.model_config import ModelConfig
from milliserve.llm.generation_params import GenerationParams
from milliserve.llm.sequence import Event

__all__ = ["EngineClient", "GenerationEvents"]


class GenerationEvents(Protocol):
    """One admitted request: iterate ``events()`` for its text; ``cancel()`` (or leaving
    the iteration early) stops it and frees what it holds."""

    prompt_tokens: int

    def events(self) -> AsyncIterator[Event]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    """A generative model as the front ends see it."""

    config: ModelConfig
    version: str

    async def generate(self, params: GenerationParams) -> GenerationEvents:
        """Admit a request (or raise the error its client gets: over budget, queue full,
        bad prompt) and start it."""
        ...

    async def complete(self, params: GenerationParams) -> tuple[str, Event]:
        """The whole answer: its text and the last event (finish reason, usage, timing)."""
        ...

    def record(self, started_ns: int, exc: BaseException | None) -> None:
        """Count a streamed request that ended (``exc`` None when it succeeded)."""
        ...
