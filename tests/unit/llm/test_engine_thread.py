"""Every llama_decode of a context runs on its engine's thread, the warm-up included.

llama.cpp's CPU backend runs a step as an OpenMP parallel region. When a second thread
that has run one stays alive (the loader pool's thread, which used to run the warm-up),
libgomp counts more threads than cores, stops spinning between regions, and a one-token
step on 2 threads took 28 ms instead of 10 (docs/design.md). This loads the smollm2
example through the servable's own load path and records the thread of every decode."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from milliserve.backends.llama_cpp import LlamaModel
from milliserve.config.model_config import load_model_config
from milliserve.llm.client import EngineClient
from milliserve.llm.generate_extension import parse_generate
from milliserve.llm.generative_servable import GenerativeServable
from milliserve.runtime.executor import Executor


def test_every_decode_runs_on_the_engine_thread(llm_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    callers: list[int] = []
    decode = LlamaModel.decode

    def recording(self: LlamaModel, *args: object) -> bool:
        callers.append(threading.get_ident())
        return decode(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaModel, "decode", recording)
    model_dir = llm_repo / "smollm2"

    async def main() -> str:
        executor = Executor()
        servable = await GenerativeServable.load(
            load_model_config(model_dir), "smollm2", "1", model_dir / "1", executor
        )
        assert isinstance(servable, EngineClient)  # what the front ends depend on
        try:
            text, _ = await servable.complete(
                parse_generate({"text_input": "The capital of France is", "max_tokens": 4, "temperature": 0})
            )
            return text
        finally:
            await servable.close()

    assert asyncio.run(main())
    assert len(callers) > 4  # the warm-up's steps and the request's
    assert len(set(callers)) == 1, "llama_decode ran on more than one thread"
    assert callers[0] != threading.get_ident()


def test_a_drafted_token_learned_as_free_does_not_stop_the_engine(
    llm_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine the warm-up's three one-token steps can all be slowed and its
    step with drafts not, so a drafted token measured as costing nothing: the next
    speculative step took math.log(0), the engine thread stopped and every request got
    'the generation engine failed'. The grounded prompt makes drafts to weigh."""
    from milliserve.llm.engine import Engine

    warmup = Engine.warmup

    def free_drafts(self: Engine) -> None:
        warmup(self)
        self.costs.draft_token_s = 0.0

    monkeypatch.setattr(Engine, "warmup", free_drafts)
    model_dir = llm_repo / "smollm2"
    text = "The council voted to build new bicycle lanes on Oak Avenue next year."
    prompt = f"Repeat this text word for word.\n\nText: {text}\n\nRepeated text: The council"

    async def main() -> str:
        servable = await GenerativeServable.load(
            load_model_config(model_dir), "smollm2", "1", model_dir / "1", Executor()
        )
        try:
            out, _ = await servable.complete(
                parse_generate(
                    {"text_input": prompt, "max_tokens": 16, "temperature": 0, "speculative": True}
                )
            )
            return out
        finally:
            await servable.close()

    assert "bicycle" in asyncio.run(main())
