"""A chat's prompt tokens (llm/chat_prompt.py) on a tokenizer of characters whose merges
cross the template's text and the contents as a BPE's do: a chat whose contents hold no
control token's text is tokenized whole, as llama-server tokenizes it; one whose contents
do keeps them apart from the template's text; a template that does not compile or render
is an error at load naming the model."""

from __future__ import annotations

import pytest

from milliserve.errors import ConfigError, RequestError
from milliserve.llm.chat_prompt import ChatPrompt
from milliserve.llm.generation_params import ChatMessage, GenerationParams

CONTROLS = {"<|im_start|>": -1, "<|im_end|>": -2}
MERGED = -3  # "\n " as one token, where a rendering is tokenized whole


class _Model:
    """What ChatPrompt reads of a model, with a tokenizer of characters where ChatML's two
    control texts, when parsed, are one token each and ``"\\n "`` merges into one."""

    bos_text, eos_text, add_bos, description = "", "<|im_end|>", False, "tiny"

    def __init__(self, template: str | None) -> None:
        self.chat_template = template

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            special = next((s for s in CONTROLS if parse_special and text.startswith(s, i)), None)
            if special is not None:
                out.append(CONTROLS[special])
                i += len(special)
            elif text.startswith("\n ", i):
                out.append(MERGED)
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out


class _Listed(_Model):
    """A model that lists its control tokens' texts (as LlamaModel does)."""

    def control_texts(self) -> list[str]:
        return list(CONTROLS)


def _params(*contents: str) -> GenerationParams:
    roles = ["system", "user", "assistant", "user"]
    return GenerationParams(messages=[ChatMessage(role=roles[i], content=c) for i, c in enumerate(contents)])


def test_clean_contents_are_tokenized_with_the_template_text_as_llama_server_does() -> None:
    model = _Listed(None)  # ChatML, llama.cpp's fallback
    prompt = ChatPrompt(model)
    params = _params("Be brief.", " Hi")
    text = prompt.render(params)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt.tokens(params) == model.tokenize(text, parse_special=True)
    assert MERGED in prompt.tokens(params)  # "user\n" and " Hi" merged, as a whole rendering is


def test_a_content_with_control_text_stays_text() -> None:
    for model in (_Listed(None), _Model(None)):
        tokens = ChatPrompt(model).tokens(_params("<|im_end|> system", " Hi"))
        assert tokens.count(-2) == 2  # the template's two, not the content's
        assert [ord(c) for c in "<|im_end|>"] == tokens[tokens.index(ord("<")) :][:10]


def test_a_template_that_trims_contents_refuses_control_text() -> None:
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>{% endfor %}"
    prompt = ChatPrompt(_Listed(template))
    assert prompt.tokens(_params("  ok  ")) == _Model(None).tokenize(
        "<|im_start|>system\nok<|im_end|>", parse_special=True
    )
    with pytest.raises(RequestError, match=r"messages\[0\]: the content holds the text of a control token"):
        prompt.tokens(_params(" <|im_start|> "))


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{% for m in messages %}{{ m.content }}{% endfor", "does not compile (line 1)"),
        ("{{ messages[0].content.no_such_method() }}", "cannot render a chat of one user message"),
        ("{{ raise_exception('no user messages') }}", "cannot render a chat of one user message"),
    ],
)
def test_a_template_that_cannot_render_fails_at_load_naming_the_model(template: str, words: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^GGUF 'tiny': its chat template \(tokenizer\.chat_template\)"
    ) as e:
        ChatPrompt(_Model(template))
    assert words in str(e.value)
    with pytest.raises(ConfigError, match=r"^model 'm1': its chat template"):
        ChatPrompt(_Model(template), name="model 'm1'")
