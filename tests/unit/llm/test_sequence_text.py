"""A sequence's text as tokens come: a stop string cuts it, an end that could begin one
is held back, and whatever ends the sequence without a stop string (EOS, max_tokens)
lets what was held back go out."""

from __future__ import annotations

from typing import Any

from milliserve.llm.sequence import GenRequest, Sequence

EOS = 0
# token -> its bytes (8 and 9: the euro sign, split in two)
PIECES = {
    1: b"It is",
    2: b" done",
    3: b".\n",
    4: b"\n",
    5: b"E",
    6: b"N",
    7: b"D",
    8: b"\xe2\x82",
    9: b"\xac",
}


class PieceModel:
    """The little of a TokenModel that text needs: each token's bytes and which one is EOS."""

    n_ctx_seq = 512

    def piece(self, token: int, special: bool = False) -> bytes:
        return PIECES[token]

    def is_eog(self, token: int) -> bool:
        return token == EOS


def _text(
    tokens: list[list[int]], stop: tuple[str, ...] = (), max_tokens: int = 64
) -> tuple[str, str | None]:
    """The text of a sequence that is given ``tokens`` a step at a time, and its finish."""
    req = GenRequest([1], max_tokens, None, lambda ev: None, stop=stop)
    s = Sequence(req, 0, None, 0, 0.0)
    out, finish = "", None
    model: Any = PieceModel()
    for new in tokens:
        text, _, finish = s.take(new, model)
        out += text
        if finish:
            break
    return out, finish


def test_a_stop_string_cuts_the_text_and_holds_back_what_could_begin_one() -> None:
    assert _text([[1], [2], [3], [4], [2]], stop=("\n\n",)) == ("It is done.", "stop")
    assert _text([[1], [5], [6], [7]], stop=("END",)) == ("It is", "stop")


def test_eos_lets_out_the_text_held_back_for_a_stop_string() -> None:
    """The answer ends on EOS with ".\\n", whose "\\n" could have begun "\\n\\n": it is
    part of the answer all the same (it was dropped)."""
    assert _text([[1], [2], [3], [EOS]], stop=("\n\n",)) == ("It is done.\n", "stop")
    assert _text([[1], [5, EOS]], stop=("END",)) == ("It isE", "stop")


def test_max_tokens_lets_out_the_text_held_back() -> None:
    assert _text([[1], [5], [6]], stop=("END",), max_tokens=3) == ("It isEN", "length")


def test_a_character_split_over_tokens_comes_whole() -> None:
    assert _text([[1], [8], [9], [EOS]]) == ("It is\u20ac", "stop")
