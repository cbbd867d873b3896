"""An interrupted step leaves the KV cache as it was before the step (preemption: priority
stops the step in flight, and the step runs again later).

llama.cpp splits a step into micro-batches (with one KV buffer per sequence, by runs of
sequence ids and by tokens per sequence) and, when stopped, takes back only the micro-batch
it stopped in: the ones before it stay. Here a step holds one token of sequence 0 and an
8-token chunk of sequence 2 (two micro-batches). It is stopped by the backend's own flag
(``interrupt``: before its first node), then at nodes spread over the whole step by a
counting abort callback installed for the test (deterministic, unlike a timer on a loaded
machine). After each stop both sequences' last KV position must be what it was. Without the
backend's own rollback a stop in the second micro-batch leaves a sequence a position ahead,
and the next step is refused (llama_decode -1: inconsistent positions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from milliserve.backends.llama_cpp import LlamaModel, LlmOptions

PROMPT = 16


def test_an_interrupted_step_leaves_no_kv_behind(llm_repo: Path) -> None:
    options = LlmOptions(n_ctx=128, n_threads=1, n_threads_batch=1)
    m = LlamaModel(llm_repo / "smollm2" / "1" / "model.gguf", options, 3)
    try:
        _stops(m)
    finally:
        m.close()


def _stops(m: LlamaModel) -> None:
    C = m._C

    def last(seq: int) -> int:
        return int(C.llama_memory_seq_pos_max(m.mem, seq))

    prompt = m.tokenize("The history of bicycles: item, item, item, item, item, item, item", True)[:PROMPT]
    assert len(prompt) == PROMPT
    for seq in (0, 2):
        assert m.decode(prompt, list(range(PROMPT)), [seq] * PROMPT, [False] * (PROMPT - 1) + [True])
    step: Any = (
        [prompt[0], *prompt[:8]],
        [PROMPT, *range(PROMPT, PROMPT + 8)],
        [0] + [2] * 8,
        [True] * 9,
    )
    before = (PROMPT - 1, PROMPT - 1)
    assert m.interruptible
    m.interrupt()  # the backend's flag: the step stops at its first node
    assert not m.decode(*step)
    m.interrupt(False)
    assert (last(0), last(2)) == before

    calls = [0]
    stop_at = [0]  # 0: never

    def counting(_data: Any) -> bool:
        calls[0] += 1
        return calls[0] == stop_at[0]

    callback = C.ggml_abort_callback(counting)
    C.llama_set_abort_callback(m.ctx, callback, None)
    try:
        assert m.decode(*step)  # counted: the nodes of the whole step
        nodes = calls[0]
        for seq in (0, 2):
            m.seq_remove(seq, PROMPT, -1)
        assert nodes > 8
        for k in sorted({1 + (nodes - 1) * i // 11 for i in range(12)}):
            calls[0], stop_at[0] = 0, k
            assert not m.decode(*step), f"not stopped at node {k} of {nodes}"
            assert (last(0), last(2)) == before, f"stopped at node {k} of {nodes}"
    finally:
        m._stop_callback()  # the backend's own again
    assert m.decode([prompt[0]], [PROMPT], [0], [True])  # the next step is accepted
