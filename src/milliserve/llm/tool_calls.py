"""Tool calling, the answer side: a model's text, as it is generated, turned into content
and OpenAI's tool calls.

Two formats: the constrained JSON document of ``llm.tools`` (``JsonCalls``), read one
character at a time so that a call's name goes out as soon as it is written and its
arguments as fragments while they are; and the ``<tool_call>{...}</tool_call>`` blocks
of Hermes-style templates (Qwen 2.5 and 3, Hermes: ``TaggedCalls``), where text
that may begin a tag is held back until it is known not to, so that a call's text never
goes out as content.

Each parser's ``feed(text)`` returns the pieces that text completes: ``str`` (content),
``CallStart`` (a call's index, id and name, always before its arguments) and
``CallArguments`` (a fragment of a call's arguments, JSON text); ``close()`` those held
at the end. A call that repeats an earlier one of the same answer (same function, same
arguments) ends the answer and is dropped (``repeated``): a small model asked for calls
in parallel otherwise writes the same call until ``max_tokens``. So a second or later
JSON call goes out whole, once it is known to be new; the first streams as it comes.
``stream_delta`` and ``message_of`` make OpenAI's chunks and message of them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from milliserve.llm.client import GenerationEvents
from milliserve.llm.sequence import Event
from milliserve.llm.tools import ToolPlan

__all__ = [
    "CallArguments",
    "CallParser",
    "CallStart",
    "JsonCalls",
    "Piece",
    "TaggedCalls",
    "answer_pieces",
    "call_parser",
    "message_of",
    "stream_delta",
]


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    index: int
    text: str


Piece = str | CallStart | CallArguments


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class CallParser(Protocol):
    calls: int  # how many calls have started
    # a call repeated an earlier one of the same answer (same function and arguments): the
    # answer ends there, without it (small models otherwise call the same again and again)
    repeated: bool

    def feed(self, text: str) -> list[Piece]: ...

    def close(self) -> list[Piece]: ...


def _add(out: list[Piece], piece: Piece) -> None:
    """Append, merging with the last piece when both are content or both one call's arguments."""
    if out:
        last = out[-1]
        if isinstance(piece, str) and isinstance(last, str):
            out[-1] = last + piece
            return
        if isinstance(piece, CallArguments) and isinstance(last, CallArguments) and last.index == piece.index:
            out[-1] = CallArguments(last.index, last.text + piece.text)
            return
    out.append(piece)


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_SPACE = " \t\r\n"


class _Frame:
    __slots__ = ("index", "is_object", "key", "want_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.key = ""
        self.index = 0
        self.want_key = is_object


class JsonCalls:
    """The constrained answer ``{"tool_calls": [{"name": ..., "arguments": ...}]}`` (or
    ``{"response": "..."}``, its text streamed as content), read as it comes. The
    grammar makes the text valid JSON of that shape, names before arguments; a scanner of
    JSON's structure (strings, escapes, nesting) is enough, no parser of values."""

    def __init__(self) -> None:
        self.calls = 0
        self._stack: list[_Frame] = []
        self._in_string = False
        self._is_key = False
        self._escape: str | None = None  # the escape being read ('' just after the backslash)
        self._high = 0  # a UTF-16 high surrogate waiting for its low half
        self._text: list[str] = []  # the string being read, decoded
        self._literal = False
        self._capture: int | None = None  # the call whose arguments are being copied
        self._capture_depth = 0
        self._cut = False
        self._named: dict[int, CallStart] = {}
        self._held: dict[int, str] = {}  # arguments seen before their call's name
        self._arguments: dict[int, str] = {}
        self._seen: set[tuple[str, str]] = set()
        self._pending: list[Piece] = []  # a second or later call, until it is whole
        self.repeated = False
        self._out: list[Piece] = []

    # where the scanner is: a key for an object, None for an array's items
    def _at(self, *path: str | None) -> bool:
        stack = self._stack
        if len(stack) != len(path):
            return False
        for f, p in zip(stack, path, strict=True):
            if (p is None) == f.is_object or (p is not None and f.key != p):
                return False
        return True

    def _put(self, i: int, piece: Piece) -> None:
        """The first call goes out as it comes; a later one when it is whole, once it is
        known not to repeat an earlier one."""
        if i:
            _add(self._pending, piece)
            return
        if isinstance(piece, CallStart):
            self.calls += 1
        _add(self._out, piece)

    def _flush(self) -> None:
        for piece in self._pending:
            if isinstance(piece, CallStart):
                self.calls += 1
            _add(self._out, piece)
        self._pending.clear()

    def _call_done(self, i: int) -> None:
        start = self._named.get(i)
        key = (start.name if start else "", self._arguments.get(i, ""))
        if key in self._seen:
            self.repeated = True
            self._pending.clear()
            return
        self._seen.add(key)
        self._flush()

    def _args(self, i: int, text: str) -> None:
        if i in self._named:
            self._put(i, CallArguments(i, text))
            self._arguments[i] = self._arguments.get(i, "") + text
        else:
            self._held[i] = self._held.get(i, "") + text

    def _value_start(self) -> None:
        stack = self._stack
        if len(stack) == 3 and self._at("tool_calls", None, "arguments"):
            self._capture, self._capture_depth = stack[1].index, len(stack)

    def _value_end(self, text: str) -> None:
        stack = self._stack
        if self._in_string and not self._is_key and len(stack) == 3 and self._at("tool_calls", None, "name"):
            i = stack[1].index
            start = CallStart(i, _call_id(), text)
            self._named[i] = start
            self._put(i, start)
            held = self._held.pop(i, "")
            if held:
                self._args(i, held)
        elif not self._in_string and len(stack) == 2 and self._at("tool_calls", None):
            self._call_done(stack[1].index)
        if self._capture is not None and len(stack) == self._capture_depth:
            self._capture = None

    def _string_char(self, ch: str) -> None:
        if not self._is_key and len(self._stack) == 1 and self._at("response"):
            _add(self._out, ch)  # the answer's text, as it is decoded
        else:
            self._text.append(ch)

    def _escaped(self, c: str) -> None:
        esc = (self._escape or "") + c
        if esc[0] != "u":
            self._escape = None
            self._string_char(_ESCAPES.get(c, c))
            return
        if len(esc) < 5:
            self._escape = esc
            return
        self._escape = None
        code = int(esc[1:], 16)
        if 0xD800 <= code < 0xDC00:
            self._high = code
            return
        if 0xDC00 <= code < 0xE000 and self._high:
            code = 0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00)
        self._high = 0
        self._string_char(chr(code) if not 0xD800 <= code < 0xE000 else "\ufffd")

    def _char(self, c: str) -> None:
        if self._in_string:
            if self._escape is not None:
                self._escaped(c)
            elif c == "\\":
                self._escape = ""
            elif c == '"':
                text = "".join(self._text)
                self._text.clear()
                if self._is_key:
                    self._stack[-1].key, self._stack[-1].want_key = text, False
                else:
                    self._value_end(text)
                self._in_string = False
            else:
                self._string_char(c)
            return
        if self._literal:
            if c not in ",}]" and c not in _SPACE:
                return
            self._literal = False
            copying = self._capture
            self._value_end("")
            # arguments that were a bare literal end before this character
            self._cut = copying is not None and self._capture is None
        if c in _SPACE:
            return
        top = self._stack[-1] if self._stack else None
        if c in "{[":
            self._value_start()
            self._stack.append(_Frame(c == "{"))
        elif c in "}]":
            if self._stack:
                self._stack.pop()
            self._value_end("")
        elif c == '"':
            self._in_string = True
            self._is_key = top is not None and top.is_object and top.want_key
            if not self._is_key:
                self._value_start()
        elif c == ",":
            if top is not None:
                if top.is_object:
                    top.want_key = True
                else:
                    top.index += 1
        elif c != ":":
            self._value_start()
            self._literal = True

    def feed(self, text: str) -> list[Piece]:
        self._out = []
        for c in text:
            if self.repeated:  # the answer ends at the repeat: the rest is not read
                break
            copying = self._capture
            self._char(c)
            i = copying if copying is not None else self._capture
            if i is not None and not self._cut:
                self._args(i, c)
            self._cut = False
        return self._out

    def close(self) -> list[Piece]:
        self._out = []
        if self._literal:
            self._literal = False
            self._value_end("")
        # arguments whose call never got a name (cut by max_tokens): nothing to call
        self._held.clear()
        if not self.repeated:
            self._flush()  # a later call cut by max_tokens: what came of it, as for the first
        return self._out


OPEN, CLOSE = "<tool_call>", "</tool_call>"


class TaggedCalls:
    """Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in
    free text. Text that may be the beginning of a tag is held until it is known; a call
    goes out when its block closes (name, then its arguments in one fragment). A block
    that does not hold a call is content, as written. Whitespace that ends content (before
    a call, or at the end) is dropped."""

    def __init__(self) -> None:
        self.calls = 0
        self._buf = ""
        self._in_call = False
        self._space = ""  # whitespace held: it goes out only before more content
        self._seen: set[tuple[str, str]] = set()
        self.repeated = False

    def _content(self, out: list[Piece], text: str) -> None:
        # trailing whitespace is held: it goes out only if more content follows
        body = text.rstrip()
        if body:
            _add(out, self._space + body)
            self._space = ""
        self._space += text[len(body) :]

    def _call(self, out: list[Piece], body: str) -> None:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        args = doc.get("arguments", doc.get("parameters")) if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not isinstance(args, dict):
            self._content(out, OPEN + body + CLOSE)
            return
        text = json.dumps(args, ensure_ascii=False)
        if (doc["name"], text) in self._seen:
            self.repeated = True
            return
        self._seen.add((doc["name"], text))
        i = self.calls
        self.calls += 1
        self._space = ""
        out.append(CallStart(i, _call_id(), doc["name"]))
        out.append(CallArguments(i, text))

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buf = self._buf + text
        while buf and not self.repeated:
            if self._in_call:
                end = buf.find(CLOSE)
                if end < 0:
                    break
                self._call(out, buf[:end])
                buf, self._in_call = buf[end + len(CLOSE) :], False
                continue
            start = buf.find(OPEN)
            if start >= 0:
                self._content(out, buf[:start])
                buf, self._in_call = buf[start + len(OPEN) :], True
                continue
            # keep the longest end of the text that could begin a tag
            keep = next(
                (n for n in range(min(len(OPEN) - 1, len(buf)), 0, -1) if OPEN.startswith(buf[-n:])), 0
            )
            self._content(out, buf[: len(buf) - keep])
            buf = buf[len(buf) - keep :]
            break
        self._buf = buf
        return out

    def close(self) -> list[Piece]:
        out: list[Piece] = []
        if self.repeated:
            return out
        if self._in_call:  # cut before its end tag: a call if what came is one
            if self._buf.strip():
                self._call(out, self._buf)
        else:
            self._content(out, self._buf)
        self._buf, self._in_call = "", False
        return out


def call_parser(plan: ToolPlan | None) -> CallParser:
    """The parser of an answer to a request with tools: the template's own format where
    the model answers in it (``plan.native``), else the constrained JSON document."""
    return TaggedCalls() if plan is not None and plan.native else JsonCalls()


async def answer_pieces(
    stream: GenerationEvents, parser: CallParser | None
) -> AsyncIterator[tuple[list[Piece], Event | None]]:
    """The pieces of each of an answer's events (its text alone without a ``parser``),
    with its last event (None before it). An answer that repeats a call is stopped there:
    its sequence is cancelled and its last event made here, finished "stop", with the
    tokens it took."""
    if parser is None:
        async for ev in stream.events():
            yield ([ev.text] if ev.text else []), (ev if ev.finish is not None else None)
        return
    tokens = 0
    async for ev in stream.events():
        tokens += ev.tokens
        pieces = parser.feed(ev.text)
        if parser.repeated and ev.finish is None:
            stream.cancel()
            prompt = stream.prompt_tokens
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": tokens,
                "total_tokens": prompt + tokens,
                "cached_tokens": 0,
                "draft_tokens": 0,
                "accepted_draft_tokens": 0,
            }
            yield pieces + parser.close(), Event("", 0, "stop", usage=usage)
            return
        if ev.finish is not None:
            yield pieces + parser.close(), ev
            return
        yield pieces, None


# ---- OpenAI's shapes ----
def stream_delta(pieces: list[Piece]) -> list[dict[str, Any]]:
    """The ``delta``s of a stream's chunks for ``pieces``: content, or tool-call fragments
    (the first of a call with its index, id, type and name; later ones its index and
    arguments), one delta per run of the same kind."""
    deltas: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for p in pieces:
        if isinstance(p, str):
            if calls:
                deltas.append({"tool_calls": calls})
                calls = []
            deltas.append({"content": p})
        elif isinstance(p, CallStart):
            fn = {"name": p.name, "arguments": ""}
            calls.append({"index": p.index, "id": p.id, "type": "function", "function": fn})
        elif calls and calls[-1]["index"] == p.index and "id" in calls[-1]:
            calls[-1]["function"]["arguments"] += p.text
        else:
            calls.append({"index": p.index, "function": {"arguments": p.text}})
    if calls:
        deltas.append({"tool_calls": calls})
    return deltas


def message_of(pieces: list[Piece]) -> dict[str, Any]:
    """The assistant message of a whole answer's pieces: ``content`` (None when the answer
    is calls alone) and ``tool_calls`` (absent when there are none)."""
    text = "".join(p for p in pieces if isinstance(p, str))
    calls: dict[int, dict[str, Any]] = {}
    for p in pieces:
        if isinstance(p, CallStart):
            fn = {"name": p.name, "arguments": ""}
            calls[p.index] = {"id": p.id, "type": "function", "function": fn}
        elif isinstance(p, CallArguments) and p.index in calls:
            calls[p.index]["function"]["arguments"] += p.text
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    elif not text:
        message["content"] = ""
    return message
