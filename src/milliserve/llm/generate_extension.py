"""Triton's generate extension (``/v2/models/<m>/generate``, and gRPC's text tensors with
their parameters): the body parsed into ``GenerationParams``. Looser than OpenAI's routes
by convention (clients put transport parameters beside the sampling ones), so only the
fields that would change the answer and are not honoured are refused, by name.
"""

from __future__ import annotations

import json
from typing import Any

from milliserve.errors import RequestError
from milliserve.llm.generation_params import (
    GenerationParams,
    parse_sampling,
    priority_of,
    refuse_unless_off,
    schema_of,
)

__all__ = ["check_generate_fields", "parse_generate"]

# Triton generate: fields that change the answer and are not honoured
_GENERATE_REFUSED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "return_log_probs": (None, False),
    "logit_bias": (None, {}),
    "bad_words": (None, [], ""),
    "beam_width": (None, 1),
    "use_beam_search": (None, False),
    "best_of": (None, 1),
    "min_tokens": (None, 0),
    "min_p": (None, 0, 0.0),
    "length_penalty": (None, 1, 1.0),
    "exclude_input_in_output": (None, True),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_grammar": (None,),
    "guided_choice": (None,),
    "lora_name": (None, ""),
}


def check_generate_fields(doc: dict[str, Any]) -> None:
    """Refuse the generate-extension fields that would change the answer if honoured."""
    refuse_unless_off(doc, _GENERATE_REFUSED)


def parse_generate(doc: Any) -> GenerationParams:
    """A Triton generate-extension body: ``text_input`` and sampling fields, at the top
    level or in ``parameters`` (and vLLM's ``sampling_parameters`` JSON string)."""
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object")
    text = doc.get("text_input")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str) or not text:
        raise RequestError("'text_input' must be a non-empty string", "text_input")
    merged: dict[str, Any] = {k: v for k, v in doc.items() if k not in ("text_input", "parameters", "id")}
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError("'parameters' must be an object", "parameters")
    merged.update(params)
    sp = merged.pop("sampling_parameters", None)
    if isinstance(sp, str):
        try:
            sp = json.loads(sp)
        except ValueError:
            raise RequestError("'sampling_parameters' must be a JSON object", "sampling_parameters") from None
    if sp is not None:
        if not isinstance(sp, dict):
            raise RequestError("'sampling_parameters' must be a JSON object", "sampling_parameters")
        merged.update(sp)
    if "stop_words" in merged and "stop" not in merged:
        merged["stop"] = merged.pop("stop_words") or None
    check_generate_fields(merged)
    p = GenerationParams(prompt=text)
    parse_sampling(merged, p)
    stream = merged.get("stream", False)
    p.stream = bool(stream) if isinstance(stream, bool | int) else False
    p.priority = priority_of(merged)
    p.schema = schema_of(merged.get("response_format"))
    return p
