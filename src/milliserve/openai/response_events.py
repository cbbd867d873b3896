"""A Responses API answer (``/v1/responses``) built from an answer's pieces (content and
tool calls, ``llm.tool_calls``): the typed events of its stream, in the order the SDK's
``client.responses.stream`` accumulates them, and the ``response`` object they end with.

A run of content is one ``message`` output item (one ``output_text`` part); each call is
one ``function_call`` item. Streamed: ``response.created``, ``response.in_progress``;
per item ``response.output_item.added``, then its deltas (``response.content_part.added``
and ``response.output_text.delta``, or ``response.function_call_arguments.delta``), then
their ``.done`` events and ``response.output_item.done``; last ``response.completed``, or
``response.incomplete`` (``incomplete_details.reason: "max_output_tokens"``) for an
answer cut by ``max_output_tokens``. A non-streamed answer is the last event's response.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from milliserve.llm.tool_calls import CallArguments, CallStart, Piece

__all__ = ["ResponseEvents", "response_echo"]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def response_echo(doc: dict[str, Any]) -> dict[str, Any]:
    """The request's settings, as a ``response`` object repeats them."""
    text = doc.get("text") if isinstance(doc.get("text"), dict) else None
    return {
        "instructions": doc.get("instructions"),
        "max_output_tokens": doc.get("max_output_tokens"),
        "temperature": doc.get("temperature", 1.0),
        "top_p": doc.get("top_p", 1.0),
        "tools": doc.get("tools") or [],
        "tool_choice": doc.get("tool_choice", "auto"),
        "parallel_tool_calls": doc.get("parallel_tool_calls", True),
        "text": text or {"format": {"type": "text"}},
        "metadata": doc.get("metadata") or {},
        "user": doc.get("user"),
        "store": False,
        "background": False,
        "previous_response_id": None,
        "truncation": "disabled",
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
    }


def _usage(usage: dict[str, int] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


class ResponseEvents:
    """The events of one response: ``start()``, ``feed(pieces)`` as they come, then
    ``finish(reason, usage)``, whose last event holds the whole ``response``."""

    def __init__(self, model: str, echo: dict[str, Any]) -> None:
        self.id = _id("resp")
        self.created = int(time.time())
        self.model = model
        self.echo = echo
        self.output: list[dict[str, Any]] = []
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the item being written
        self._calls: dict[int, dict[str, Any]] = {}  # by the call's index in the answer

    def response(
        self, status: str, usage: dict[str, int] | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": self.output if status != "in_progress" else [],
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
            "usage": _usage(usage),
            **self.echo,
        }

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.response("in_progress")),
            self._event("response.in_progress", response=self.response("in_progress")),
        ]

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self._open = item
        shown = {**item, "status": "in_progress"}
        if item["type"] == "message":
            shown["content"] = []
        else:
            shown["arguments"] = ""
        return [self._event("response.output_item.added", output_index=len(self.output) - 1, item=shown)]

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self.output) - 1
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.output_text.done", **where, text=part["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", **where, part=part))
        else:
            where = {"item_id": item["id"], "output_index": index}
            out.append(
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            )
        item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _text(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        item = self._open
        if item is None or item["type"] != "message":
            out += self._close()
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {
                "type": "message",
                "id": _id("msg"),
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
            out += self._add(item)
            where = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.content_part.added", **where, part=empty))
        item["content"][0]["text"] += text
        where = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
        out.append(self._event("response.output_text.delta", **where, delta=text, logprobs=[]))
        return out

    def feed(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in pieces:
            if isinstance(p, str):
                if p:
                    out += self._text(p)
            elif isinstance(p, CallStart):
                out += self._close()
                item = {
                    "type": "function_call",
                    "id": _id("fc"),
                    "call_id": p.id,
                    "name": p.name,
                    "arguments": "",
                    "status": "completed",
                }
                self._calls[p.index] = item
                out += self._add(item)
            elif isinstance(p, CallArguments) and p.index in self._calls:
                item = self._calls[p.index]
                item["arguments"] += p.text
                if item is self._open:
                    where = {"item_id": item["id"], "output_index": len(self.output) - 1}
                    out.append(self._event("response.function_call_arguments.delta", **where, delta=p.text))
        return out

    def finish(self, finish: str | None, usage: dict[str, int] | None) -> list[dict[str, Any]]:
        """The closing events; the last one's ``response`` is the whole answer."""
        out = self._close()
        if finish == "length":
            final = self.response("incomplete", usage, "max_output_tokens")
            return [*out, self._event("response.incomplete", response=final)]
        return [*out, self._event("response.completed", response=self.response("completed", usage))]
