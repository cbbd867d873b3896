"""Greedy answers of milliserve and llama.cpp's llama-server on the same GGUF, compared token
for token, on files unlike SmolLM2 (benchmarks/gguf_variants.py: another architecture, a
vocabulary 3.1x larger with Qwen2.5's template, no template at all) and on SmolLM2 itself.

For each file and chat: the prompt as each server renders it (llama-server's
``/apply-template``, then ``/tokenize`` as its chat route tokenizes: BOS as the vocabulary
says, control-token text parsed; milliserve's ``ChatPrompt`` on the same file), then each
server's answer at temperature 0 (text, token counts, finish reason). The figures go to the
results store (``benchmarks/results/gguf-agreement.json``, no doc section).

    python benchmarks/gguf_agreement.py [--variants qwen2 wide bare] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf_variants
import results_store
from peers.llama_server import LlamaServer

from milliserve.testing import ServerProcess, free_port

CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "Name three primary colours."},
        {"role": "assistant", "content": "Red, yellow and blue."},
        {"role": "user", "content": "And the secondary ones?"},
    ],
    [{"role": "user", "content": "List the numbers from 1 to 10, separated by commas."}],
    [{"role": "user", "content": "  Spaces around, and a newline at the end\n"}],
    [{"role": "user", "content": "Translate 'good morning' into German and Spanish."}],
    [{"role": "user", "content": "def add(a, b):\n    # finish this Python function"}],
]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def _answer(base: str, chat: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    got = _post(
        f"{base}/v1/chat/completions",
        {"model": "m", "messages": chat, "temperature": 0, "max_tokens": max_tokens},
    )
    choice = got["choices"][0]
    return {
        "text": choice["message"].get("content") or "",
        "finish": choice["finish_reason"],
        "prompt_tokens": got["usage"]["prompt_tokens"],
        "completion_tokens": got["usage"]["completion_tokens"],
    }


def _our_prompt_tokens(gguf: Path) -> Any:
    """milliserve's prompt tokens for a chat, from its ChatPrompt on ``gguf``."""
    from milliserve.backends.llama_cpp import LlamaModel
    from milliserve.backends.llama_options import parse_llm_options
    from milliserve.config.model_config import ModelConfig
    from milliserve.llm.chat_prompt import ChatPrompt
    from milliserve.llm.generation_params import ChatMessage, GenerationParams

    model = LlamaModel(gguf, parse_llm_options(ModelConfig(name="m")), 1)
    prompts = ChatPrompt(model)

    def tokens(chat: list[dict[str, str]]) -> list[int]:
        params = GenerationParams(messages=[ChatMessage(role=m["role"], content=m["content"]) for m in chat])
        return prompts.tokens(params)

    return tokens, model


def compare(variant: str, gguf: Path, max_tokens: int, threads: int) -> dict[str, Any]:
    repo = Path(tempfile.mkdtemp(prefix="gguf-agreement-"))
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.gguf").symlink_to(gguf)
    (repo / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "llama_cpp"\n'
        f'parameters {{ key: "n_threads" value {{ string_value: "{threads}" }} }}\n'
    )
    ours_tokens, model = _our_prompt_tokens(gguf)
    rows = []
    try:
        theirs = LlamaServer(gguf, free_port(), threads, 1, 4096)
        try:
            for chat in CHATS:
                text = _post(f"{theirs.url}/apply-template", {"messages": chat})["prompt"]
                tokens = _post(
                    f"{theirs.url}/tokenize", {"content": text, "add_special": True, "parse_special": True}
                )["tokens"]
                rows.append({"chat": chat, "their_tokens": tokens, "our_tokens": ours_tokens(chat)})
                rows[-1]["theirs"] = _answer(theirs.url, chat, max_tokens)
        finally:
            theirs.stop()
    finally:
        model.close()
    with ServerProcess(repo) as ours:
        for row in rows:
            row["ours"] = _answer(f"http://{ours.http_url}", row["chat"], max_tokens)
    for row in rows:
        row["prompt_agrees"] = row["their_tokens"] == row["our_tokens"]
        a, b = row["ours"], row["theirs"]
        row["answer_agrees"] = a == b
        row["extra_token_answered"] = "[extra_" in a["text"] or "[extra_" in b["text"]
    return {"variant": variant, "file": gguf.name, "rows": rows}


def _refused_at_load(gguf: Path, threads: int) -> str:
    """What llama-server does with a GGUF whose template does not compile."""
    try:
        server = LlamaServer(gguf, free_port(), threads, 1, 4096)
    except RuntimeError as exc:
        last = [line for line in str(exc).splitlines() if "template" in line][:1]
        return f"exits at load ({last[0].strip() if last else 'no template line in its log'})"
    server.stop()
    return "starts"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="*", default=["smollm2", "qwen2", "wide", "bare"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-record", action="store_true", help="print only; write no results entry")
    args = ap.parse_args()
    results = []
    for variant in args.variants:
        gguf = gguf_variants.packaged_gguf() if variant == "smollm2" else gguf_variants.build(variant)
        res = compare(variant, gguf, args.max_tokens, args.threads)
        results.append(res)
        for i, row in enumerate(res["rows"]):
            if not (row["prompt_agrees"] and row["answer_agrees"]):
                print(f"{variant} chat {i} differs:", json.dumps(row, ensure_ascii=False, indent=1))
    lines = [
        "| file | chats | prompt tokens equal | answers equal (text, token counts, finish) | "
        "answer tokens compared |",
        "|---|---|---|---|---|",
    ]
    summary: dict[str, Any] = {}
    for res in results:
        rows = res["rows"]
        prompts = sum(r["prompt_agrees"] for r in rows)
        answers = sum(r["answer_agrees"] for r in rows)
        compared = sum(r["theirs"]["completion_tokens"] for r in rows)
        n = len(rows)
        lines.append(f"| {res['file']} | {n} | {prompts}/{n} | {answers}/{n} | {compared} |")
        summary[res["variant"]] = {
            "chats": len(rows),
            "prompt_tokens_equal": prompts,
            "answers_equal": answers,
            "answer_tokens": compared,
            "extra_tokens_answered": sum(r["extra_token_answered"] for r in rows),
        }
    broken = _refused_at_load(gguf_variants.build("broken"), args.threads)
    lines.append(f"\nA template that does not compile: llama-server {broken}; milliserve fails the load.")
    summary["broken_template_llama_server"] = broken
    body = "\n".join(lines)
    print(body)
    if not args.no_record:
        script = "benchmarks/gguf_agreement.py"
        results_store.record(
            "gguf-agreement",
            body,
            doc=None,
            script=script,
            settings={"run": vars(args), "llama-server": "-np 1 -c 4096, jinja (its default)"},
            values=results,
            summary=summary,
            peers={"llama-server": "llama.cpp as vendored by the installed llama-cpp-python"},
            sources=[
                script,
                "benchmarks/gguf_variants.py",
                "src/milliserve/llm/chat_prompt.py",
                "src/milliserve/backends/llama_cpp.py",
            ],
        )
    agree = all(r["prompt_agrees"] and r["answer_agrees"] for res in results for r in res["rows"])
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
