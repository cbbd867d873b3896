"""A request's prompt as tokens: its chat rendered by the model's template (where the GGUF
has none, ChatML, which llama.cpp falls back to; one that does not compile or render is an
error at load), tokenized so that only the template's own text can become control tokens;
its size checked before it is tokenized. A chat with tools is rendered with them in the
template's own format where it has one (``llm.template_tools``), else with them described
in the system message."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from milliserve.errors import ConfigError, RequestError
from milliserve.llm.generation_params import ChatMessage, GenerationParams
from milliserve.llm.template_tools import native_calls, template_message, template_tools, tool_messages
from milliserve.llm.tools import call_schema

__all__ = ["MAX_PROMPT_BYTES", "ChatPrompt", "check_size", "compile_template"]

# a prompt's text beyond this is refused before it is tokenized
MAX_PROMPT_BYTES = 1 << 20


def check_size(text: str, contents: int = 0) -> None:
    """Refuse a prompt over MAX_PROMPT_BYTES (``contents``: its messages' characters)."""
    if max(len(text), contents) > MAX_PROMPT_BYTES or len(text.encode()) > MAX_PROMPT_BYTES:
        raise RequestError(f"the prompt is over {MAX_PROMPT_BYTES} bytes", "messages")


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def compile_template(source: str | None, model: str = "the GGUF") -> Any:
    """The model's chat template compiled in jinja2's sandbox; None (ChatML) where it has
    none. ConfigError naming ``model`` where it does not compile."""
    if not source:
        return None
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def fail(message: str) -> None:
        raise RequestError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = fail
    # as transformers renders templates: plain JSON (jinja2's own escapes <, > and ' for
    # HTML, which would change the tools and arguments a model reads)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ConfigError(
            f"{model}: its chat template (tokenizer.chat_template) does not compile{where}: {exc}"
        ) from None


class ChatPrompt:
    """Prompts for one model (``model``: its tokenizer, special-token texts and template)."""

    def __init__(self, model: Any, name: str | None = None) -> None:
        self.model = model
        # errors at load name it (``name``: "model 'smollm2'"; by default the GGUF's own name)
        name = name or f"GGUF {getattr(model, 'description', 'unnamed')!r}"
        self.template = compile_template(model.chat_template, name)
        if self.template is not None:
            try:  # a template that cannot render one user's message cannot serve
                self._probe(messages=[{"role": "user", "content": "Hello"}])
            except Exception as exc:
                raise ConfigError(
                    f"{name}: its chat template (tokenizer.chat_template) cannot render a chat of "
                    f"one user message: {exc}"
                ) from None
        # a content holding one of these texts is tokenized apart from the template's text
        # (a model without the list: by tokenizing it both ways)
        texts = model.control_texts() if hasattr(model, "control_texts") else None
        self._controls = (
            re.compile("|".join(re.escape(t) for t in sorted(set(texts), key=len, reverse=True)))
            if texts
            else None
        )
        self._by_tokens = texts is None
        # the template shows tools and calls in its own format, one this server parses
        self.native_tools = self.template is not None and native_calls(model.chat_template, self._probe)

    def _probe(self, **context: Any) -> str:
        return str(
            self.template.render(
                add_generation_prompt=True,
                bos_token=self.model.bos_text,
                eos_token=self.model.eos_text,
                **context,
            )
        )

    def plan_tools(self, params: GenerationParams) -> None:
        """Decide how a request with tools is answered: in the template's own call format
        (parsed; ``auto`` on a template that has one) or held to the calls' JSON schema
        (``params.schema``; ``required``, a named function, or a template without one)."""
        plan = params.tools
        if plan is None:
            return
        plan.native = self.native_tools and plan.choice == "auto"
        params.schema = None if plan.native else call_schema(plan)

    def messages(self, params: GenerationParams) -> list[ChatMessage]:
        """The messages the template renders: the request's, or, for a template without
        tools, those with the tools described and the calls and their results as text."""
        given = params.messages or []
        if (params.tools is None and not params.tool_history) or self.native_tools:
            return given
        return tool_messages(given, params.tools)

    def render(
        self,
        params: GenerationParams,
        contents: list[str] | None = None,
        given: list[ChatMessage] | None = None,
    ) -> str:
        """The chat as the model's template renders it (``given``: its messages, by default
        ``messages(params)``; with ``contents`` in place of their contents, when given)."""
        if given is None:
            given = self.messages(params)
        texts = contents if contents is not None else [m.content for m in given]
        if params.tool_history and self.native_tools:
            msgs = [template_message(m, t) for m, t in zip(given, texts, strict=True)]
        else:
            msgs = [{"role": m.role, "content": t} for m, t in zip(given, texts, strict=True)]
        if self.template is None:  # ChatML, the common default
            body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
            return body + "<|im_start|>assistant\n"
        extra: dict[str, Any] = {}
        if params.tools is not None and self.native_tools:
            extra["tools"] = template_tools(params.tools.offered())
        try:
            return str(
                self.template.render(
                    messages=msgs,
                    add_generation_prompt=True,
                    bos_token=self.model.bos_text,
                    eos_token=self.model.eos_text,
                    **extra,
                )
            )
        except RequestError:
            raise
        except Exception as exc:
            raise RequestError(f"the chat template could not render these messages: {exc}") from None

    def tokens(self, params: GenerationParams) -> list[int]:
        """The request's prompt tokens: its chat rendered (``render``) or its prompt text."""
        if params.messages is not None:
            return self._chat_tokens(params)
        text = params.prompt or ""
        check_size(text)
        return list(self.model.tokenize(text, add_special=self.model.add_bos, parse_special=False))

    def _chat_tokens(self, params: GenerationParams) -> list[int]:
        """The chat's tokens, where only the template's text can become control tokens: a
        user who writes ``<|im_end|>`` gets those characters tokenized as text, never the
        token that ends a turn. Where no content holds a control token's text, the rendering
        is tokenized whole, as llama-server tokenizes it (a content's first and last tokens
        can merge with the template's text around it: ``"user\n"`` then ``"  Hi"`` are
        other tokens than ``"user\n  Hi"``). Where one does, the template is rendered with a
        marker in place of each message's content; its own text is tokenized with special
        tokens parsed, the contents without (a template that changes the contents, trims
        them say, is then refused)."""
        model = self.model
        msgs = self.messages(params)
        if self.native_tools and (params.tools is not None or params.tool_history):
            self._refuse_tool_control_text(params, msgs)
        check_size("", sum(len(m.content) for m in msgs))
        controls = self._control_texts(msgs)
        if not controls:
            whole = self.render(params, None, msgs)
            check_size(whole)
            special = model.add_bos and not (model.bos_text and whole.startswith(model.bos_text))
            return list(model.tokenize(whole, add_special=special, parse_special=True))
        nonce = secrets.token_hex(8)
        # an empty content stays empty: a template may test it (Qwen's ``if message.content``
        # on an assistant's message that only calls tools)
        marks = [f"\x00{nonce}:{i}\x00" if m.content else "" for i, m in enumerate(msgs)]
        marked = self.render(params, marks, msgs)
        check_size(marked, sum(len(m.content) for m in msgs))
        special = model.add_bos and not (model.bos_text and marked.startswith(model.bos_text))
        pieces = re.split(f"\x00{nonce}:(\\d+)\x00", marked)
        joined = "".join(msgs[int(p)].content if i % 2 else p for i, p in enumerate(pieces))
        if self.template is not None and self.render(params, None, msgs) != joined:
            # the template changes the contents (trims them, say): no marker keeps them apart
            raise RequestError(
                f"messages[{controls[0]}]: the content holds the text of a control token, which "
                "this model's chat template cannot keep apart from its own",
                "messages",
            )
        out: list[int] = []
        for i, piece in enumerate(pieces):
            if not piece:
                continue
            if i % 2:
                out += model.tokenize(msgs[int(piece)].content, add_special=False, parse_special=False)
            else:
                out += model.tokenize(piece, add_special=special and not out, parse_special=True)
        return out

    def _refuse_tool_control_text(self, params: GenerationParams, msgs: list[ChatMessage]) -> None:
        """A template with a call format renders the tools and the calls as its own text
        (no marker keeps them apart): refuse those that hold control-token text."""
        texts = [
            (f"messages[{i}].tool_calls", c.name + c.arguments)
            for i, m in enumerate(msgs)
            for c in m.tool_calls
        ]
        if params.tools is not None:
            texts += [
                (f"tools[{i}]", json.dumps(t.parameters) + t.name + t.description)
                for i, t in enumerate(params.tools.tools)
            ]
        tokenize = self.model.tokenize
        for where, text in texts:
            if tokenize(text, False, True) != tokenize(text, False, False):
                raise RequestError(
                    f"{where} holds the text of a control token, which this model's chat template "
                    "cannot keep apart from its own",
                    "tools" if where.startswith("tools") else "messages",
                )

    def _control_texts(self, msgs: list[ChatMessage]) -> list[int]:
        """The messages whose content holds a control token's text."""
        if self._controls is not None:
            search = self._controls.search
            return [i for i, m in enumerate(msgs) if search(m.content)]
        if not self._by_tokens:  # a vocabulary without control tokens
            return []
        tokenize = self.model.tokenize
        return [
            i
            for i, m in enumerate(msgs)
            if tokenize(m.content, False, True) != tokenize(m.content, False, False)
        ]
