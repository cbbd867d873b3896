"""Which request fields generation honours, and the refusal of every other one.

A field the server would accept and then ignore is a silent lie: a client asking for
JSON got prose, a client asking for log-probabilities got none. So each field of
OpenAI's chat and text completion requests is here in one of three groups:

- honoured (parsed in ``openai.completions`` and ``llm.generation_params``; a chat's
  tools in ``llm.tools``);
- describing the caller, not the answer (``user``, ``metadata``...): accepted, they
  change nothing OpenAI's own server would return either;
- not supported: accepted only with the value that means "off" (``logprobs: false``,
  ``tools: []``), otherwise a 400 that names the field.

Anything else on an OpenAI route is refused by name too. (Triton's generate extension
is looser by convention: ``llm.generate_extension``.)
"""

from __future__ import annotations

from typing import Any

from milliserve.errors import RequestError
from milliserve.llm.generation_params import refuse_unless_off

__all__ = ["check_openai_fields"]

_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "response_format",
        "service_tier",
        # milliserve's (and vLLM's) extra fields
        "top_k",
        "repetition_penalty",
        "ignore_eos",
        "speculative",
        "priority",
    }
)
# tool calling (llm.tools), chat only
_TOOLS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
_CHAT = _COMMON | _TOOLS | {"messages", "max_completion_tokens"}
_COMPLETION = _COMMON | {"prompt"}
# the caller's bookkeeping: no effect on any answer (OpenAI's server uses them for abuse
# monitoring, dashboards and cache routing; the prefix cache here needs no hint)
_BOOKKEEPING = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key"})
# not supported: the values that mean "off", which are accepted
_OFF: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "store": (None, False),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
}
_OFF_CHAT = {k: v for k, v in _OFF.items() if k not in _TOOLS}


def check_openai_fields(doc: dict[str, Any], chat: bool) -> None:
    """Refuse, by name, any field of a chat or text completion that would not be honoured."""
    known = _CHAT if chat else _COMPLETION
    refuse_unless_off(doc, _OFF_CHAT if chat else _OFF)
    for key in doc:
        if key not in known and key not in _BOOKKEEPING and key not in _OFF:
            what = "chat completion" if chat else "completion"
            raise RequestError(f"unknown field '{key[:64]}' for a {what} request", key[:64])
    opts = doc.get("stream_options")
    if isinstance(opts, dict):
        for key, value in opts.items():
            if key != "include_usage" and value not in (None, False):
                raise RequestError(
                    f"'stream_options.{key[:64]}' is not supported by this server", "stream_options"
                )
        if not isinstance(opts.get("include_usage", False), bool):
            raise RequestError("'stream_options.include_usage' must be true or false", "stream_options")
