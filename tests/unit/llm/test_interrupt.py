"""An interrupted step leaves the KV cache as it was before the step (preemption: priority
stops the step in flight, and the step runs again later).

llama.cpp splits a step into micro-batches (with one KV buffer per sequence, by runs of
sequence ids and by tokens per sequence) and, when stopped, takes back only the micro-batch
it stopped in: the ones before it stay. Here a step holds one token of sequence 0 and a
48-token chunk of sequence 2 (two micro-batches), stopped after a delay that sweeps the
step's length; after each, both sequences' last KV position must be what it was. Without
the backend's own rollback a stop in the second micro-batch leaves sequence 0 one position
ahead, and the next step is refused (llama_decode -1: inconsistent positions)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from milliserve.backends.llama_cpp import LlamaModel, LlmOptions


def test_an_interrupted_step_leaves_no_kv_behind(llm_repo: Path) -> None:
    m = LlamaModel(llm_repo / "smollm2" / "1" / "model.gguf", LlmOptions(n_ctx=512), 3)
    try:
        _sweep(m)
    finally:
        m.close()


def _sweep(m: LlamaModel) -> None:
    assert m.interruptible

    def last(seq: int) -> int:
        return int(m._C.llama_memory_seq_pos_max(m.mem, seq))

    prompt = m.tokenize("The history of bicycles: " + "item, " * 40, True)[:64]
    for seq in (0, 2):
        assert m.decode(prompt, list(range(64)), [seq] * 64, [False] * 63 + [True])
    tokens = [prompt[0], *prompt[:48]]
    pos = [64, *range(64, 112)]
    seqs = [0] + [2] * 48
    t0 = time.perf_counter()
    assert m.decode(tokens, pos, seqs, [True] * 49)  # uninterrupted: how long a step takes
    step_s = time.perf_counter() - t0
    for seq in (0, 2):
        m.seq_remove(seq, 64, -1)
    stopped = 0
    for k in range(24):
        timer = threading.Timer(step_s * k / 16, m.interrupt)
        timer.start()
        ran = m.decode(tokens, pos, seqs, [True] * 49)
        timer.join()
        m.interrupt(False)
        if ran:  # the timer came after the step: take it back by hand, as a later step would
            for seq in (0, 2):
                m.seq_remove(seq, 64, -1)
        else:
            stopped += 1
        assert (last(0), last(2)) == (63, 63), f"stopped after {k / 16:.2f} of a step"
    assert stopped >= 8  # the sweep stopped the step at many points of it
    assert m.decode([prompt[0]], [64], [0], [True])  # and the next step is accepted
