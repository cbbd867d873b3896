"""``milliserve bench``: its flags, and the command that runs one of its modes: tensors
(any Open Inference Protocol server, the default), ``--llm`` (streamed completions from
any OpenAI-compatible server) or ``--embeddings`` (OpenAI's ``/v1/embeddings``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from milliserve.cli.console import table_console
from milliserve.cli.serve import UsageError

__all__ = ["add_bench_parser"]

# the flags not every mode takes: the modes that take them, and the default that means
# "not given" (given with another mode, they are an error)
_T, _E, _L = "tensor", "embeddings", "llm"
_MODE_FLAGS: dict[str, tuple[frozenset[str], Any]] = {
    **{k: (frozenset({_T}), d) for k, d in (("model_version", ""), ("shape", None), ("zipf", None))},
    **{k: (frozenset({_T}), d) for k, d in (("text_input", None), ("json_tensors", False))},
    **{k: (frozenset({_T}), d) for k, d in (("split_writes", False), ("cold_start", False))},
    **{k: (frozenset({_T, _E}), d) for k, d in (("stability", None), ("window", 2.0), ("batch_size", 1))},
    **{k: (frozenset({_T, _E}), None) for k in ("data", "metrics_url")},
    **{k: (frozenset({_L, _E}), None) for k in ("extra_body", "api_key")},
    **{
        k: (frozenset({_L}), None)
        for k in (
            "endpoint",
            "prompts",
            "max_tokens",
            "temperature",
            "compare_extra_body",
            "requests",
            "slo_ttft_ms",
            "slo_itl_ms",
            "request_timeout",
        )
    },
}


def _levels(text: str, kind: type) -> list:  # type: ignore[type-arg]
    """``1,2,4`` or a range ``1:16:2`` (start:stop:multiplier for concurrency, step for rates)."""
    try:
        if ":" in text:
            start, stop, step = (kind(x) for x in [*text.split(":"), "2"][:3])
            out, v = [], start
            while v <= stop:
                out.append(v)
                v = v * step if kind is int else v + step
            return out
        return [kind(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1,2,4 or a range like 1:16") from None


def _shape(text: str) -> tuple[str, list[int]]:
    name, _, dims = text.partition(":")
    try:
        return name, [int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape {text!r} must look like NAME:16 or NAME:3,224,224"
        ) from None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object like '{{\"ignore_eos\": true}}'")
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _mode(args: argparse.Namespace) -> str:
    return _L if args.llm else _E if args.embeddings else _T


def _check_mode(args: argparse.Namespace) -> None:
    mode = _mode(args)
    for name, (modes, default) in _MODE_FLAGS.items():
        if mode in modes or getattr(args, name) == default:
            continue
        if modes == {_L}:
            raise UsageError(f"{_flag(name)}: only with --llm")
        if modes == {_L, _E}:
            raise UsageError(f"{_flag(name)}: only with --llm or --embeddings")
        raise UsageError(f"{_flag(name)}: not used with --{mode}")
    if mode == _T and not args.model:
        raise UsageError("the tensor mode needs the model: -m NAME")


@contextmanager
def _progress() -> Iterator[Callable[[str, float], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        state: dict[str, TaskID] = {}

        def step(what: str, seconds: float) -> None:
            # one bar per window, driven by rich's refresh thread from the planned length
            # (0: not known beforehand, a pulsing bar)
            if "task" in state:
                progress.update(state["task"], completed=progress.tasks[-1].total)
            state["task"] = progress.add_task(what, total=seconds or None)
            progress.start_task(state["task"])

        yield step


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from milliserve.bench.run_report import print_report, write_csv, write_json
    from milliserve.bench.runner import BenchConfig, run_bench
    from milliserve.plotting import pyplot

    _check_mode(args)
    if args.plot:
        pyplot("milliserve bench --plot")  # before the run: fail now if it cannot draw

    def given(name: str, default: Any) -> Any:
        value = getattr(args, name)
        return default if value is None else value

    cfg = BenchConfig(
        url=args.url,
        model=args.model,
        mode=_mode(args),
        concurrency=args.concurrency or [],
        rates=args.rate or [],
        poisson=not args.constant,
        seed=args.seed,
        duration_s=args.duration,
        warmup_s=args.warmup,
        requests=args.requests,
        stability_pct=args.stability,
        window_s=args.window,
        workers=args.workers,
        compare_url=args.compare,
        rounds=args.rounds,
        calibrate=not args.no_calibrate,
        batch=args.batch_size,
        data=args.data,
        metrics_url=args.metrics_url,
        version=args.model_version or "",
        zipf=args.zipf,
        text_input=args.text_input,
        shapes=dict(args.shape or []),
        binary=not args.json_tensors,
        split_writes=args.split_writes,
        cold_start=args.cold_start,
        extra_body=given("extra_body", {}),
        api_key=args.api_key,
        endpoint=given("endpoint", "chat"),
        prompts=given("prompts", "builtin:chat"),
        max_tokens=given("max_tokens", 128),
        temperature=given("temperature", 0.0),
        compare_extra_body=args.compare_extra_body,
        slo_ttft_ms=given("slo_ttft_ms", 1000.0),
        slo_itl_ms=given("slo_itl_ms", 100.0),
        timeout_s=given("request_timeout", 300.0),
    )
    with _progress() as step:
        report = run_bench(cfg, step)
    print_report(report, table_console())
    if args.json:
        write_json(report, args.json)
    if args.csv:
        write_csv(report, args.csv)
    if args.plot:
        from milliserve.bench.plots import write_plots

        for path in write_plots(report, args.plot):
            Console(stderr=True).print(f"wrote {path}")
    return 0


def add_bench_parser(sub: Any) -> None:
    """Add ``bench`` to the subcommands ``sub`` (argparse's ``add_subparsers()``)."""
    b = sub.add_parser(
        "bench",
        help="measure latency and throughput of any OIP server, or with --llm or --embeddings any "
        "OpenAI-compatible one",
    )
    b.add_argument(
        "url", help="http://host:port or grpc://host:port (--llm, --embeddings: http://host:port[/v1])"
    )
    b.add_argument(
        "-m", "--model", default=None, help="the model (--llm, --embeddings: default the first of /v1/models)"
    )
    b.add_argument("--model-version", default="")
    load = b.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=lambda t: _levels(t, int), help="closed loop: 1,2,4,8 or 1:8 (doubling)"
    )
    load.add_argument("--rate", type=lambda t: _levels(t, float), help="open loop requests/s: 100,200,400")
    b.add_argument("--constant", action="store_true", help="constant arrivals instead of Poisson (open loop)")
    b.add_argument(
        "--seed",
        type=int,
        default=0,
        help="open loop: the Poisson arrivals' seed (another seed, another schedule)",
    )
    b.add_argument(
        "--duration", type=float, default=None, help="measured seconds per level (default 5; 20 with --llm)"
    )
    b.add_argument(
        "--warmup", type=float, default=1.0, help="seconds not counted before each level (default 1)"
    )
    b.add_argument(
        "--stability",
        type=float,
        default=None,
        metavar="PCT",
        help="run windows until 3 agree within PCT%% on throughput and p99 (like perf_analyzer -s)",
    )
    b.add_argument("--window", type=float, default=2.0, help="window seconds with --stability (default 2)")
    b.add_argument(
        "-b",
        "--batch-size",
        type=int,
        default=1,
        help="the batch dimension (--embeddings: texts per request)",
    )
    b.add_argument(
        "--shape", action="append", type=_shape, metavar="NAME:DIMS", help="dims of a variable input"
    )
    b.add_argument(
        "--data",
        default=None,
        help="random (default), zero, a JSON file of OIP request bodies, or a .txt file of texts "
        "(one per line); --embeddings: builtin (default) or a .txt file of texts",
    )
    b.add_argument(
        "--zipf", type=float, default=None, metavar="S", help="with --data FILE.txt: Zipf-distributed repeats"
    )
    b.add_argument("--text-input", default=None, help="with --data FILE.txt: the model's BYTES input")
    b.add_argument("--json-tensors", action="store_true", help="HTTP: JSON tensors instead of binary")
    b.add_argument(
        "--split-writes",
        action="store_true",
        help="HTTP: send each request's head and body in two writes, as libcurl (perf_analyzer) does",
    )
    b.add_argument(
        "--workers",
        type=int,
        default=0,
        help="client processes (default 1: each one takes a core from a server on the same machine; "
        "add more only when the late-send warning says one cannot keep up)",
    )
    b.add_argument("--metrics-url", default=None, help="server Prometheus endpoint, for queue/compute split")
    b.add_argument("--compare", default=None, metavar="URL2", help="run URL2 too, A B A B, and print ratios")
    b.add_argument("--rounds", type=int, default=3, help="rounds per target with --compare (default 3)")
    b.add_argument("--no-calibrate", action="store_true", help="skip the null-server calibration run")
    b.add_argument(
        "--cold-start",
        action="store_true",
        help="unload and load the model through the repository API and measure the cold start",
    )
    b.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    b.add_argument("--csv", type=Path, default=None, help="write the results as CSV")
    b.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write PNG plots into DIR")
    which = b.add_mutually_exclusive_group()
    which.add_argument(
        "--llm",
        action="store_true",
        help="streamed completions from an OpenAI-compatible server: TTFT, ITL, tokens/s, goodput",
    )
    which.add_argument(
        "--embeddings",
        action="store_true",
        help="OpenAI's /v1/embeddings: latency, requests/s and texts/s (-b texts per request, --data texts)",
    )
    both = b.add_argument_group("--llm and --embeddings")
    both.add_argument(
        "--extra-body",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="merged into each request body, e.g. '{\"ignore_eos\": true}' or '{\"dimensions\": 128}'",
    )
    both.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    llm = b.add_argument_group("LLM mode (--llm): streamed completions from an OpenAI-compatible server")
    llm.add_argument("--endpoint", choices=("chat", "completions"), default=None, help="default chat")
    llm.add_argument(
        "--prompts",
        default=None,
        metavar="SPEC",
        help="builtin:chat (default), builtin:summarise, or a file: JSONL of "
        '{"messages": [...]} or {"prompt": "..."}, or one prompt per line',
    )
    llm.add_argument("--max-tokens", type=int, default=None, help="per request (default 128)")
    llm.add_argument("--temperature", type=float, default=None, help="default 0")
    llm.add_argument(
        "--compare-extra-body",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="B's requests add this to --extra-body; without --compare, B is the same server "
        "(A/B of a request option, e.g. '{\"speculative\": false}')",
    )
    llm.add_argument(
        "--requests", type=int, default=None, metavar="N", help="measure N requests per level, not --duration"
    )
    llm.add_argument(
        "--slo-ttft-ms",
        type=float,
        default=None,
        help="goodput: time to first token objective (default 1000)",
    )
    llm.add_argument(
        "--slo-itl-ms",
        type=float,
        default=None,
        help="goodput: objective for each request's inter-token latency p99 (default 100)",
    )
    llm.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds per request before it counts as an error (default 300)",
    )
    b.set_defaults(func=_bench)
