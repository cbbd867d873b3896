"""Prompts for ``milliserve bench --llm``: built-in sets, or a file.

``builtin:chat`` is a dozen varied chat prompts (questions, code, lists, a story,
arithmetic, and four that summarise or extract from a quoted text);
``builtin:summarise`` holds only prompts that quote an input text and ask for a
summary or an extraction. Their answers repeat the input's words, which is what
prompt-lookup (n-gram) speculative decoding feeds on: measure a speculative
setting with it, and the plain one with ``builtin:chat``.

A file is JSONL, one ``{"messages": [...]}`` or ``{"prompt": "..."}`` object per line
(optionally with its own ``"max_tokens"``), or plain text with one prompt per line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from milliserve.errors import ConfigError

__all__ = ["BUILTIN_SETS", "Prompt", "load_prompts"]


@dataclass(frozen=True)
class Prompt:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int | None = None  # this prompt's own limit, from a file

    @property
    def text(self) -> str:
        """For /v1/completions: the last user message (or the whole prompt)."""
        users = [c for r, c in self.messages if r == "user"]
        return users[-1] if users else self.messages[-1][1]


def _user(text: str) -> Prompt:
    return Prompt((("user", text),))


_REPORT = (
    "The Harbour Bridge maintenance report for March says that 14 of the 212 deck joints "
    "were replaced, two weeks ahead of schedule, at a cost of 1.8 million euros against a "
    "budget of 2.1 million. Corrosion was found on the north approach girders, where the "
    "paint system installed in 2009 has failed in three places; the engineers recommend "
    "blasting and repainting those sections before the winter. Traffic was restricted to "
    "one lane on six nights. Two complaints about noise were received, both from residents "
    "of Quay Street, and both were answered within a day."
)
_EMAIL = (
    "Hi Dana, following up on Tuesday's call: we agreed to move the launch of the billing "
    "service from 3 June to 17 June so that the payment provider can finish its security "
    "review. Marco will update the migration scripts by 10 June, Priya owns the rollback "
    "plan, and I will tell the support team. The price stays at 12 euros per seat per month. "
    "Please confirm the new date with Legal by Friday. Thanks, Sam"
)
_ABSTRACT = (
    "We study request scheduling for large language model inference on CPUs. Serving "
    "systems batch the decode steps of concurrent requests, but a long prompt's prefill "
    "stalls every stream in the batch. We split prefills into chunks of 64 tokens and "
    "interleave them with decode steps. On a 2-core machine with a 135M-parameter model, "
    "chunking cuts the 99th percentile inter-token latency from 410 ms to 95 ms at four "
    "concurrent streams, while throughput drops by 6 percent. Time to first token for long "
    "prompts rises by 18 percent. We release our scheduler and traces."
)
_TICKET = (
    "Customer: Anna Berg, account 44-1093. Order 88213 placed on 2 May: two Model K "
    "kettles and one descaling kit. One kettle arrived with a cracked lid; the descaling "
    "kit was missing. She asks for a replacement lid, the missing kit, and a refund of "
    "the 4.90 euro shipping fee. Preferred contact: email, anna.berg@example.org."
)
_MINUTES = (
    "Board meeting, 9 October. Present: Okafor (chair), Lindqvist, Haddad, Moreau. The "
    "treasurer reported a surplus of 42,000 euros for the third quarter. The board "
    "approved the new travel policy by three votes to one, Moreau against. Haddad will "
    "draft the volunteer code of conduct for the November meeting. The annual dinner "
    "moves to the Riverside Hall because of the renovation. Next meeting: 13 November."
)
_RECIPE = (
    "Preheat the oven to 200 degrees. Slice four potatoes thinly and layer them in a "
    "buttered dish with one sliced onion. Warm 300 ml of cream with two cloves of garlic "
    "and a pinch of nutmeg, pour it over, and top with 80 g of grated cheese. Bake for "
    "50 minutes until golden, and rest for ten minutes before serving."
)

SUMMARISE = [
    _user(f"Summarise this report in three sentences.\n\n{_REPORT}"),
    _user(f"List every decision, owner and date in this email as bullet points.\n\n{_EMAIL}"),
    _user(f"Summarise this abstract for a general reader, keeping its numbers.\n\n{_ABSTRACT}"),
    _user(f"Extract the customer's name, account, order number and requests as JSON.\n\n{_TICKET}"),
    _user(f"Write the action items from these minutes, one per line.\n\n{_MINUTES}"),
    _user(f"Rewrite this recipe as a numbered list of steps, keeping every quantity.\n\n{_RECIPE}"),
]

GENERAL = [
    _user("What is the difference between a process and a thread?"),
    _user("Write a Python function that returns the n-th Fibonacci number iteratively."),
    Prompt(
        (
            ("system", "You are a concise assistant."),
            ("user", "Give me five ideas for a rainy Sunday afternoon."),
        )
    ),
    _user("Explain why the sky is blue to a ten-year-old."),
    _user("Write a short story of about 100 words about a lighthouse keeper and a cat."),
    _user("A train leaves at 14:20 and arrives at 17:05. How long is the journey? Show your steps."),
    _user("Translate into French: 'The meeting is postponed until next Thursday morning.'"),
    _user("What are the pros and cons of working from home? Answer in a short table."),
]

BUILTIN_SETS: dict[str, list[Prompt]] = {
    "chat": GENERAL + SUMMARISE[:4],
    "summarise": SUMMARISE,
}


def _from_json(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected an object with 'messages' or 'prompt', got {obj!r:.80}")
    limit = obj.get("max_tokens")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"{where}: 'max_tokens' must be a positive integer, got {limit!r}")
    if isinstance(obj.get("prompt"), str):
        return Prompt((("user", obj["prompt"]),), limit)
    messages = obj.get("messages")
    if isinstance(messages, list) and messages:
        out = []
        for m in messages:
            if not (
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            ):
                raise ConfigError(f"{where}: each message needs a string 'role' and 'content', got {m!r:.80}")
            out.append((m["role"], m["content"]))
        return Prompt(tuple(out), limit)
    raise ConfigError(f"{where}: expected 'messages' (a non-empty list) or 'prompt' (a string)")


def load_prompts(spec: str) -> list[Prompt]:
    """``builtin:NAME`` or a path. Raises ConfigError naming an unknown set, a missing
    file, or the first line that is not a prompt."""
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_SETS:
            raise ConfigError(f"--prompts {spec!r}: unknown set; give one of {sorted(BUILTIN_SETS)}")
        return BUILTIN_SETS[name]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"--prompts {spec!r} is neither builtin:{'|builtin:'.join(BUILTIN_SETS)} nor a file"
        )
    lines = [(i, ln) for i, ln in enumerate(path.read_text().splitlines(), 1) if ln.strip()]
    if not lines:
        raise ConfigError(f"{path}: no prompts in it")
    if path.suffix == ".jsonl" or lines[0][1].lstrip().startswith("{"):
        prompts = []
        for i, ln in lines:
            try:
                obj = orjson.loads(ln)
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{i}: not JSON ({exc})") from None
            prompts.append(_from_json(obj, f"{path}:{i}"))
        return prompts
    return [_user(ln.strip()) for _, ln in lines]
