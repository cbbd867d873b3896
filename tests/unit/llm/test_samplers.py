"""Samplers on the real model. Greedy decoding reads the highest logit itself (numpy)
instead of through llama.cpp's sampler chain, which copies the whole vocabulary first; it
must pick the same token at every position, ties included (the first of the highest).
A repetition, frequency or presence penalty builds llama.cpp's penalties sampler."""

from __future__ import annotations

from pathlib import Path

from milliserve.backends.llama_cpp import GREEDY, LlamaModel, LlmOptions, SamplerSpec
from milliserve.backends.llama_grammar import logits_view


def test_greedy_picks_what_llama_cpps_greedy_sampler_picks(llm_repo: Path) -> None:
    m = LlamaModel(llm_repo / "smollm2" / "1" / "model.gguf", LlmOptions(n_ctx=256), 1)
    try:
        assert m.new_sampler(SamplerSpec(temperature=0.0)) is GREEDY
        # a penalty or a schema keeps llama.cpp's chain
        assert m.new_sampler(SamplerSpec(temperature=0.0, repetition_penalty=1.1)) is not GREEDY
        prompt = m.tokenize("The history of bicycles begins in 1817, when Karl Drais built", True)
        n = len(prompt)
        assert m.decode(prompt, list(range(n)), [0] * n, [True] * n)
        chain = m._chain(SamplerSpec(temperature=0.0))
        try:
            for i in range(n):
                assert m.sample(GREEDY, i) == m.sample(chain, i), i
            row = logits_view(m._C.llama_get_logits_ith(m.ctx, 0), m.n_vocab)
            row[9] = row[5] = row.max() + 1.0  # a tie: both take the first
            assert m.sample(GREEDY, 0) == m.sample(chain, 0) == 5
        finally:
            m.free_sampler(chain)
        m.accept(GREEDY, prompt[0])  # no history to keep
        m.free_sampler(GREEDY)  # nothing to free
    finally:
        m.close()


def test_greedy_reads_each_steps_logits_through_views_kept_by_address(llm_repo: Path) -> None:
    """Greedy sampling keeps a numpy view of each logits row's address (making one anew was
    half of a token's sampling). A step of another size may move llama.cpp's output buffer:
    every pick must still be the argmax of the row llama.cpp hands out for that step."""
    m = LlamaModel(llm_repo / "smollm2" / "1" / "model.gguf", LlmOptions(n_ctx=512), 2)
    try:
        prompt = m.tokenize("Lists of rivers, mountains and the cities that lie between them:", True)
        n = len(prompt)
        pos = n
        kept = 0
        for k, width in enumerate((1, n, 3, 1, 2 * n, 1, 1, 1)):  # one-token steps between wider
            m.seq_remove(0, pos, -1)
            tokens = (prompt * 3)[:width]
            assert m.decode(tokens, list(range(pos, pos + width)), [0] * width, [True] * width)
            for i in range(width):
                fresh = logits_view(m._C.llama_get_logits_ith(m.ctx, i), m.n_vocab)
                assert m.sample(GREEDY, i) == int(fresh.argmax()), (width, i)
            pos += width
            if k == 5:
                kept = len(m._rows)
        assert kept and len(m._rows) == kept  # a view per row address, not one per step
    finally:
        m.close()


def test_penalties_build_llama_cpps_sampler_and_sample(llm_repo: Path) -> None:
    """The binding takes the vocabulary size first; called without it, it raised TypeError
    on the engine thread and stopped the engine (tests/unit/llm/test_engine_steps.py)."""
    m = LlamaModel(llm_repo / "smollm2" / "1" / "model.gguf", LlmOptions(n_ctx=256), 1)
    try:
        prompt = m.tokenize("Repeat after me: red red red red red red", True)
        n = len(prompt)
        assert m.decode(prompt, list(range(n)), [0] * n, [False] * (n - 1) + [True])
        plain = m.new_sampler(SamplerSpec(temperature=0.0))
        for spec in (
            SamplerSpec(temperature=0.0, repetition_penalty=1.3),
            SamplerSpec(temperature=0.0, frequency_penalty=1.5),
            SamplerSpec(temperature=0.7, presence_penalty=1.0, seed=3),
        ):
            sampler = m.new_sampler(spec)
            try:
                for t in prompt:
                    m.accept(sampler, t)
                token = m.sample(sampler, n - 1)
                assert 0 <= token < m.n_vocab
            finally:
                m.free_sampler(sampler)
        red = m.sample(plain, n - 1)
        penalised = m.new_sampler(SamplerSpec(temperature=0.0, frequency_penalty=2.0))
        try:
            for t in prompt:
                m.accept(penalised, t)
            assert m.sample(penalised, n - 1) != red or red not in prompt  # the penalty acts
        finally:
            m.free_sampler(penalised)
    finally:
        m.close()
