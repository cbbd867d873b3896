"""The memory of earlier answers that sequences draft from (llm/memory.py)."""

from __future__ import annotations

from milliserve.llm.memory import DraftMemory
from milliserve.llm.sequence import MATCH_TOKENS


def test_a_draft_follows_the_longest_match_and_stops_where_its_answer_ended() -> None:
    mem = DraftMemory(1000)
    mem.add([1, 2, 3], [10, 11, 12, 13])  # 3 13 ... 11 would match "12" alone: too short
    mem.add([7, 8], [20, 11, 12, 30, 31])
    mem.add([5, 6], [40, 11, 12, 50])
    # "20 11 12" matched 3 tokens in the second answer, where the third matches 2
    assert mem.lookup([99, 20, 11, 12], 10) == ([30, 31], 3)
    # among equal matches the latest; the draft ends with its answer
    assert mem.lookup([99, 11, 12], 10) == ([50], 2)
    assert mem.lookup([99, 11, 12], 0) == ([], 0)
    assert mem.lookup([99, 12], 10) == ([], 0)  # one token matched is not enough
    # the end of a prompt is kept: a prompt asked again drafts its answer from its first step
    assert mem.lookup([0, 1, 2, 3], 3) == ([10, 11, 12], 3)


def test_no_match_runs_across_two_answers() -> None:
    mem = DraftMemory(1000)
    mem.add([1], [2, 3])
    mem.add([4], [5, 6])
    # "3 | 4 5": the gap between the answers stops the match at "4 5"
    assert mem.lookup([2, 3, 4, 5], 5) == ([6], 2)


def test_the_oldest_answers_go_and_the_index_follows() -> None:
    mem = DraftMemory(60)
    for k in range(15):
        mem.add([1000 + k], [k, 500 + k, 600 + k, 700 + k])  # 6 tokens each, with the gap
    assert len(mem) <= 60
    assert mem.lookup([1014, 14], 2) == ([514, 614], 2)  # the latest answer is kept
    assert mem.lookup([1000, 0], 2) == ([], 0)  # the first went
    for t, positions in mem._index.items():
        assert all(mem.tokens[p] == t for p in positions)
    for _ in range(30):  # forgetting again and again keeps it bounded
        mem.add([1], list(range(2, 2 + 40)))
    assert len(mem) <= 60
    assert mem.lookup([1, 2, 3], 3) == ([4, 5, 6], 3)


def test_no_memory_keeps_nothing_and_an_answer_longer_than_it_is_skipped() -> None:
    off = DraftMemory(0)
    off.add([1, 2], [3, 4])
    assert len(off) == 0 and off.lookup([1, 2], 4) == ([], 0)
    small = DraftMemory(20)
    small.add([1], list(range(100, 120)))
    assert len(small) == 0
    small.add(list(range(50)), [7])  # of a long prompt, its last MATCH_TOKENS tokens
    assert small.tokens == [-1, *range(50 - MATCH_TOKENS, 50), 7]
