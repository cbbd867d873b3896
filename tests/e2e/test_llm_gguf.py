"""GGUFs unlike SmolLM2 (benchmarks/gguf_variants.py builds them from its weights): another
architecture with a vocabulary 3.1x larger and Qwen2.5's template answers; a GGUF without a
template is prompted in ChatML token for token as llama-server prompts it; one whose
template does not compile fails at load, the error naming the model."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from milliserve.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gguf_variants  # noqa: E402

VARIANTS = ("wide", "bare", "broken")
CHAT = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "  And of Italy?\n"},
]
# llama.cpp's fallback (common/chat.cpp, CHATML_TEMPLATE_SRC) as it renders CHAT
CHATML = (
    "<|im_start|>system\nYou answer in one short sentence.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\nParis.<|im_end|>\n"
    "<|im_start|>user\n  And of Italy?\n<|im_end|>\n"
    "<|im_start|>assistant\n"
)


# a small context loads faster (the tests' chats are short)
SMALL = "".join(
    f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
    for k, v in (("n_ctx", "512"), ("max_sequences", "2"))
)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    kept = os.environ.get("MILLISERVE_TEST_CACHE")
    work = Path(kept) / "gguf-variants" if kept else tmp_path_factory.mktemp("gguf-variants")
    return {v: gguf_variants.build(v, work) for v in VARIANTS}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, ggufs: dict[str, Path]) -> Iterator[ServerProcess]:
    """The variants in one repository, loaded through the repository API."""
    repo = tmp_path_factory.mktemp("gguf-repo")
    for name, path in ggufs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.gguf").symlink_to(path)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "llama_cpp"\n{SMALL}')
    with ServerProcess(repo, "--model-control-mode", "explicit") as proc:
        yield proc


def _load(server: ServerProcess, name: str) -> httpx.Response:
    return httpx.post(f"http://{server.http_url}/v2/repository/models/{name}/load", timeout=120)


def _chat(server: ServerProcess, name: str, messages: list[dict[str, str]]) -> dict[str, object]:
    body = {"model": name, "messages": messages, "temperature": 0, "max_tokens": 24}
    r = httpx.post(f"http://{server.http_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    got: dict[str, object] = r.json()
    return got


def test_another_architecture_with_a_wide_vocabulary_answers(server: ServerProcess) -> None:
    assert _load(server, "wide").status_code == 200
    got = _chat(server, "wide", [{"role": "user", "content": "What is the capital of France?"}])
    text = got["choices"][0]["message"]["content"]  # type: ignore[index]
    # SmolLM2's own answer, through qwen2's graph; no padded token ever wins
    assert "Paris" in text and "[extra_" not in text, text


def test_no_template_falls_back_to_chatml_as_llama_cpp_renders_it(
    server: ServerProcess, ggufs: dict[str, Path]
) -> None:
    from milliserve.backends.llama_cpp import LlamaModel
    from milliserve.backends.llama_options import parse_llm_options
    from milliserve.config.model_config import ModelConfig
    from milliserve.llm.chat_prompt import ChatPrompt
    from milliserve.llm.generation_params import ChatMessage, GenerationParams

    model = LlamaModel(ggufs["bare"], parse_llm_options(ModelConfig(name="bare")), 1)
    try:
        assert model.chat_template is None
        params = GenerationParams(messages=[ChatMessage(role=m["role"], content=m["content"]) for m in CHAT])
        ours = ChatPrompt(model).tokens(params)
        # llama-server tokenizes its rendering whole, control-token text parsed
        theirs = model.tokenize(CHATML, add_special=True, parse_special=True)
    finally:
        model.close()
    assert ours == theirs
    assert _load(server, "bare").status_code == 200
    got = _chat(server, "bare", CHAT)
    assert got["usage"]["prompt_tokens"] == len(theirs)  # type: ignore[index]


def test_a_template_that_does_not_compile_fails_at_load_naming_the_model(server: ServerProcess) -> None:
    r = _load(server, "broken")
    assert r.status_code >= 400, r.text
    message = r.json()["error"]
    assert message.startswith("failed to load 'broken': GGUF 'SmolLM2 135M as broken': its chat template")
    assert "does not compile (line 1)" in message, message
    index = httpx.post(f"http://{server.http_url}/v2/repository/index", timeout=10).json()
    (entry,) = [m for m in index if m["name"] == "broken"]
    assert entry["state"] == "UNAVAILABLE" and "chat template" in entry["reason"], entry
