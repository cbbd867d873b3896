"""Three sections of benchmarks/llm.py (run through ``--parts structured,priority,cold``):

- ``llm-structured``: what structured output costs: output tokens/s of one and of 8
  streams with and without ``response_format`` (a JSON schema), and of a tool call
  constrained by the same schema (``tool_choice`` naming the function), on the same server.
- ``llm-priority``: TTFT of a ``priority: 1`` request under a background of 8 streaming
  chats (every slot taken), against the same request on the idle server; with the
  default admission (it takes the next free slot) and with ``preemption: priority``.
- ``llm-cold-start``: two models behind one port under ``--llm-memory-mib 1`` (the smollm2
  GGUF under two names; one fits at a time), asked in turn, so that each request finds its
  model unloaded: its time to first token with the load, against the same request once the
  model is loaded.

``--quick`` (of llm.py) makes each a few seconds' check; the figures for docs come from
a full run on a quiet machine.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from milliserve.bench.llm_stream import parse_server_timing
from milliserve.percentiles import percentile
from milliserve.testing import ServerProcess

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "rating": {"type": "number", "minimum": 0, "maximum": 10},
    },
    "required": ["title", "year", "tags", "rating"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe a film as JSON.",
    "Describe a book as JSON.",
    "Describe a song as JSON.",
    "Describe a game.",
]


def _pct(xs: list[float], p: float) -> float:
    return percentile(xs, p) if xs else float("nan")


TOOL = {
    "type": "function",
    "function": {"name": "describe", "description": "Record a work's details.", "parameters": SCHEMA},
}
MODES = ("free", "schema", "tool")  # free text, response_format's JSON schema, a named tool call


async def _tokens_per_s(url: str, streams: int, seconds: float, mode: str) -> float:
    kw: dict[str, Any] = {}
    if mode == "schema":
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    elif mode == "tool":
        kw["tools"] = [TOOL]
        kw["tool_choice"] = {"type": "function", "function": {"name": "describe"}}
    tokens = 0
    end = time.perf_counter() + seconds
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300) as c:

        async def loop(i: int) -> None:
            nonlocal tokens
            while time.perf_counter() < end:
                out = await c.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    max_tokens=96,
                    temperature=0.7,
                    seed=i,
                    **kw,
                )
                assert out.usage is not None
                tokens += out.usage.completion_tokens

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(streams)))
        return tokens / (time.perf_counter() - t0)


def structured_part(repo: Path, rounds: int, seconds: float, where: str) -> str:
    """The ``llm-structured`` section's text."""
    got: dict[tuple[int, str], list[float]] = {}
    with ServerProcess(repo) as srv:
        url = f"http://{srv.http_url}"
        for mode in MODES[1:]:  # warm (the first compile of each grammar)
            asyncio.run(_tokens_per_s(url, 1, 2.0, mode))
        for r in range(rounds):
            for streams in (1, 8):
                order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]  # the order rotates
                for mode in order:
                    v = asyncio.run(_tokens_per_s(url, streams, seconds, mode))
                    got.setdefault((streams, mode), []).append(v)
                    print(f"structured: round {r} {streams} streams {mode}: {v:.1f} tok/s")
    rows = []
    for streams in (1, 8):
        free, bound, tool = (statistics.median(got[(streams, m)]) for m in MODES)
        rows.append(
            f"| {streams} | {free:.1f} | {bound:.1f} | {bound / free:.2f}× "
            f"| {tool:.1f} | {tool / free:.2f}× |"
        )
    return (
        "## Structured output: what a JSON schema costs (benchmarks/llm.py --parts structured)\n\n"
        f"{where}. Chat completions of at most 96 tokens (temperature 0.7), closed loops of 1 and 8 "
        f"streams, {seconds:g} s each, {rounds} rounds (medians; the modes' order rotates), with and "
        "without `response_format` (a `json_schema` of four fields: strings, an integer and a number "
        "with bounds, an array), and as a tool call with the same schema as the function's parameters "
        "(`tools` and `tool_choice` naming it: the call is constrained by the schema). "
        "The schema is compiled by llguidance and applied as a token mask at sampling; llama.cpp's "
        "own GBNF grammar sampler was measured at 5.4 ms a token against llguidance's 0.45 ms on "
        "this vocabulary (49k tokens), which is why llguidance serves it. Constrained sequences do "
        "not draft (prompt lookup is off for them).\n\n"
        "| streams | output tok/s, free text | with a JSON schema | ratio | a tool call | ratio |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


async def _ttft(url: str, priority: int | None) -> float:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300) as c:
        extra = {"priority": priority} if priority else {}
        t0 = time.perf_counter()
        stream = await c.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=4,
            temperature=0,
            stream=True,
            extra_body=extra,
        )
        first = float("nan")
        async for chunk in stream:
            if first != first and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
        return first


async def _background(url: str, streams: int) -> None:
    async def one(i: int) -> None:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300) as c:
            while True:
                async for _ in await c.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": f"Tell me a long story number {i}."}],
                    max_tokens=128,
                    temperature=0.7,
                    stream=True,
                ):
                    pass

    await asyncio.gather(*(one(i) for i in range(streams)))


def background(url: str, streams: int) -> None:
    """The background load, in a process of its own (until terminated)."""
    asyncio.run(_background(url, streams))


async def _under_load_one_loop(url: str, samples: int) -> list[float]:
    """As ``_under_load``, the background on the measuring client's own event loop."""
    bg = asyncio.create_task(_background(url, 8))
    await asyncio.to_thread(_wait_full, url, lambda: not bg.done())
    out = []
    for _ in range(samples):
        out.append(await _ttft(url, 1))
        await asyncio.sleep(0.1)
    bg.cancel()
    await asyncio.gather(bg, return_exceptions=True)
    return out


def _running(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("milliserve_generation_running{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_full(url: str, alive: Callable[[], bool]) -> None:
    """Until the background's 8 streams hold every slot, and a second more (past their
    prompts: decoding, as a busy server is)."""
    deadline = time.monotonic() + 120
    while _running(url) < 8:
        if time.monotonic() > deadline or not alive():
            raise RuntimeError("the background streams did not take every slot")
        time.sleep(0.2)
    time.sleep(1.0)


def _under_load(url: str, samples: int) -> list[float]:
    """TTFT of ``samples`` priority requests, one at a time, while 8 streams of another
    process keep every slot taken. The background runs apart: on the measuring client's
    own event loop, its 8 readers' chunks delayed the measured stream's first chunk, which
    is the client's cost, not the server's."""
    bg = multiprocessing.get_context("spawn").Process(target=background, args=(url, 8), daemon=True)
    bg.start()
    try:
        _wait_full(url, bg.is_alive)
        out = []
        for _ in range(samples):
            out.append(asyncio.run(_ttft(url, 1)))
            time.sleep(0.1)
        return out
    finally:
        bg.terminate()
        bg.join(10)


def priority_part(write_repo: Any, root: Path, gguf: Path, samples: int, rounds: int, where: str) -> str:
    """The ``llm-priority`` section's text: per mode, ``rounds`` rounds of ``samples`` idle
    samples then ``samples`` under each background (their order alternating), so that the
    idle p99, which is the third-worst of 200 samples (nearest rank), is measured as often as the loaded."""
    rows = []
    for mode in ("fair", "priority"):
        repo = write_repo(root / f"prio-{mode}", gguf, "smollm2", {"n_ctx": "2048", "preemption": mode})
        kinds = ["another process"] + (["the client's own loop"] if mode == "priority" else [])
        idle: list[list[float]] = []
        loaded: dict[str, list[list[float]]] = {k: [] for k in kinds}
        with ServerProcess(repo) as srv:
            url = f"http://{srv.http_url}"
            asyncio.run(_ttft(url, None))
            for r in range(rounds):
                idle.append([asyncio.run(_ttft(url, 1)) for _ in range(samples)])
                for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                    if kind == "another process":
                        loaded[kind].append(_under_load(url, samples))
                    else:
                        loaded[kind].append(asyncio.run(_under_load_one_loop(url, samples)))
                    i99, l99 = _pct(idle[r], 99), _pct(loaded[kind][r], 99)
                    print(
                        f"priority: preemption={mode}, round {r}, background on {kind}: idle p99 "
                        f"{i99 * 1e3:.0f} ms, under load p99 {l99 * 1e3:.0f} ms",
                        flush=True,
                    )
        all_idle = [x for xs in idle for x in xs]
        i99 = _pct(all_idle, 99)
        for kind, got in loaded.items():
            every = [x for xs in got for x in xs]
            l99 = _pct(every, 99)
            per = [_pct(g, 99) / _pct(i, 99) for g, i in zip(got, idle, strict=True)]
            rows.append(
                f"| {mode} | {kind} | {_pct(all_idle, 50) * 1e3:.0f} / {i99 * 1e3:.0f} | "
                f"{_pct(every, 50) * 1e3:.0f} / {l99 * 1e3:.0f} | {l99 / i99:.2f}× | "
                f"{statistics.median(per):.2f}× ({min(per):.2f}–{max(per):.2f}) |"
            )
    return (
        "## Priority: a high-priority request's TTFT under load (benchmarks/llm.py --parts priority)\n\n"
        f"{where}. A streamed chat with `priority: 1`, one at a time, on the idle server and under a "
        "background of 8 streaming chats of 128 tokens that restart as they end (every one of the "
        "8 slots taken), sent by another process on the same cores, as other users' traffic is; "
        "with `preemption: priority` also from the measuring client's own event loop, where the 8 "
        f"readers' chunks compete with the measured one. {rounds} rounds of {samples} samples idle, "
        "then under each background (their order alternating); percentiles over all samples, and "
        "the ratio of p99s per round. `fair` is the default admission: the priority request goes "
        "ahead of every queued one and takes the next slot that frees; `priority` (`preemption: "
        "priority`) also suspends the latest background sequence (its KV to host memory) so that "
        "it starts at once, and stops the step in flight: its prompt runs alone in the next step "
        "(llm.md, admission item 6). Goal: p99 within 1.5× of idle.\n\n"
        "| preemption | background from | idle TTFT p50 / p99 ms | under 8 streams p50 / p99 ms "
        "| p99 ratio | per round, median (min–max) |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def _first_token(url: str, model: str) -> tuple[float, dict[str, float]]:
    """A one-token completion: the client's seconds to its answer (its first token) and the
    Server-Timing figures (``load`` where the model loaded for it)."""
    body = json.dumps({"model": model, "prompt": "Name a colour:", "max_tokens": 1, "temperature": 0})
    req = urllib.request.Request(f"{url}/v1/completions", data=body.encode(), method="POST")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()
        took = time.perf_counter() - t0
        timing = parse_server_timing(resp.headers.get("Server-Timing", ""))
    return took, timing


def cold_part(gguf: Path, work: Path, requests: int, where: str) -> str:
    """The ``llm-cold-start`` section's text."""
    repo = work / "cold-repo"
    names = ("smol_a", "smol_b")
    for name in names:
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        link = repo / name / "1" / "model.gguf"
        if not link.exists():
            link.symlink_to(gguf.resolve())
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "llama_cpp"\n')
    cold: list[float] = []
    loads: list[float] = []
    warm: list[float] = []
    with ServerProcess(repo, "--llm-memory-mib", "1") as srv:
        url = f"http://{srv.http_url}"
        for i in range(requests):
            model = names[i % 2]  # the other one is loaded: this one loads, the other unloads
            took, timing = _first_token(url, model)
            if "load" not in timing:
                raise RuntimeError(f"{model} answered without loading: {timing}")
            cold.append(took * 1e3)
            loads.append(timing["load"])
            took, timing = _first_token(url, model)
            if "load" in timing:
                raise RuntimeError(f"{model} loaded again for its second request: {timing}")
            warm.append(took * 1e3)
            print(f"cold start {i}: {model} {cold[-1]:.0f} ms (load {loads[-1]:.0f}), warm {warm[-1]:.1f} ms")
    size = gguf.stat().st_size / 2**20

    def row(what: str, xs: list[float]) -> str:
        return f"| {what} | {statistics.median(xs):.1f} | {_pct(xs, 90):.1f} | {max(xs):.1f} |"

    return (
        "## Cold start: a model loaded on its first request (benchmarks/llm.py --parts cold)\n\n"
        f"{where}. Two models behind one port with `--llm-memory-mib 1` (the smollm2 GGUF, "
        f"{size:.0f} MiB, under two names; one fits at a time), asked in turn: each request finds its "
        "model unloaded, loads it (the other, idle, unloads) and answers; then the same request again, "
        f"on the loaded model. {requests} of each; a one-token completion, timed at the client "
        "(its answer is its first token); the load time from the answer's Server-Timing.\n\n"
        "| request | ms p50 | p90 | max |\n|---|---|---|---|\n"
        + "\n".join(
            [
                row("cold: load + first token", cold),
                row("of which the load", loads),
                row("warm: first token", warm),
            ]
        )
        + "\n"
    )
