"""What differs between ``milliserve bench``'s modes, and nothing else: how a run's requests
are built, which figures a level has, how the report shows them, and which zero-latency
server calibrates the tool. The load generator, the levels, the A/B rounds and the report's
frame are shared (loadgen.py, runner.py, run_report.py).

- ``tensor``: any Open Inference Protocol server, over HTTP or gRPC (workload.py).
- ``embeddings``: OpenAI's ``/v1/embeddings`` (embeddings_workload.py); latency as the
  tensor mode, plus texts embedded per second.
- ``llm``: streamed completions from an OpenAI-compatible server (llm_workload.py); TTFT,
  ITL, tokens/s and goodput (llm_results.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from milliserve.bench.embeddings_workload import build_embeddings_workload, load_texts
from milliserve.bench.fake_openai import fake_openai_process
from milliserve.bench.fake_server import fake_server_process
from milliserve.bench.llm_prompts import BUILTIN_SETS, load_prompts
from milliserve.bench.llm_results import LlmLevelResult, Slo, summarize_llm
from milliserve.bench.llm_workload import ENDPOINTS, build_llm_workload
from milliserve.bench.loadgen import LoadWorkload, WorkerPool
from milliserve.bench.openai_target import default_embedding_model, default_model, parse_api_target
from milliserve.bench.records import Records
from milliserve.bench.results import LevelResult, summarize
from milliserve.bench.run_options import BenchConfig
from milliserve.bench.workload import build_workload, parse_target
from milliserve.errors import ConfigError

__all__ = ["MODES", "Level", "Mode", "Window"]

Level = LevelResult | LlmLevelResult


@dataclass(frozen=True)
class Window:
    """How long a level's workers ran (warmup included: their CPU share is over it), how
    long it measured, and in how many windows (``--stability``)."""

    run_s: float
    window_s: float
    windows: int = 1
    stable: bool = True


_STATS = ("p50", "p90", "p95", "p99", "max")
Column = tuple[str, Callable[[Any], str]]  # a table column: its title, a level's cell


def _latency(key: str) -> Callable[[Any], float]:
    return lambda lv: float(lv.latency_us.get(key, 0.0))


class Mode:
    """The request/response modes' frame (tensor, embeddings); ``LlmMode`` overrides."""

    name = ""
    median_figure = "p50"  # the round reported for A/B runs: the median of this
    compare_figures: ClassVar[dict[str, Callable[[Any], float]]] = {
        "throughput": lambda lv: float(lv.throughput),
        **{k: _latency(k) for k in ("p50", "p90", "p95", "p99", "p99.9", "max", "mean")},
    }
    ratio_figures: tuple[str, ...] = ("throughput", "p50", "p99")
    compare_values = True  # the A/B table shows A and B, not only B/A

    def figure(self, lv: Any, key: str) -> float:
        return float(self.compare_figures[key](lv)) if key in self.compare_figures else 0.0

    def check(self, cfg: BenchConfig) -> None:
        if cfg.stability_pct is not None and cfg.requests is not None:
            raise ConfigError("--stability runs timed windows; it does not go with --requests")

    def workload(self, cfg: BenchConfig, url: str, extra_body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def summarize(self, cfg: BenchConfig, load: str, level: float, rec: Records, w: Window) -> Level:
        """The level's figures from its records; ``w`` says how long it ran and measured."""
        cores = os.cpu_count() or 1
        per = self.inputs_per_request(cfg)
        return summarize(load, level, rec, w.window_s, cores, w.run_s, w.windows, w.stable, per)

    def inputs_per_request(self, cfg: BenchConfig) -> int | None:
        return None

    def add_server_split(self, lv: Level, split: dict[str, float] | None) -> None:
        lv.server = split

    def config_doc(self, cfg: BenchConfig) -> dict[str, Any]:
        return {
            "mode": "closed" if cfg.concurrency else "open",
            "arrivals": "poisson" if cfg.poisson else "constant",
            "seed": cfg.seed,
            "duration_s": cfg.duration_s,
            "warmup_s": cfg.warmup_s,
            "stability_pct": cfg.stability_pct,
            "batch": cfg.batch,
            "data": cfg.data,
            "workers": cfg.workers,
        }

    def calibrate(self, workers: int) -> dict[str, Any]:
        raise NotImplementedError

    # ---- the report ----
    def title(self, cfg: BenchConfig, kind: str) -> str:
        return f"{cfg.model} @ {cfg.url} ({kind})"

    def columns(self) -> list[Column]:
        def lat(key: str) -> Column:
            return f"{key} µs", lambda lv: f"{lv.latency_us[key]:,.0f}" if key in lv.latency_us else "-"

        def srv(title: str, key: str, fmt: str) -> Column:
            return title, lambda lv: format((lv.server or {})[key], fmt) if key in (lv.server or {}) else "-"

        return [
            ("req/s", lambda lv: f"{lv.throughput:,.0f}"),
            *(lat(k) for k in ("p50", "p90", "p95", "p99", "p99.9", "max")),
            ("errors", lambda lv: f"{sum(lv.errors.values())}"),
            ("late", lambda lv: f"{lv.late_sends}"),
            ("late p50 µs", lambda lv: f"{lv.late_send_p50_us:,.0f}" if lv.mode == "open" else "-"),
            ("client CPU", lambda lv: f"{lv.client_cpu_share:.0%}"),
            srv("srv queue µs", "queue_us", ",.0f"),
            srv("srv compute µs", "compute_us", ",.0f"),
            srv("avg batch", "avg_batch_size", ".1f"),
        ]

    def footer(self, cfg: BenchConfig) -> list[str]:
        return []

    def notes(self, lv: Any) -> list[str]:
        out = [
            f"[red]{lv.label}: stall: {st['requests']:.0f} requests scheduled between "
            f"{st['start_s']:.2f} s and {st['end_s']:.2f} s took up to {st['max_ms']:.0f} ms[/red]"
            for st in lv.stalls
        ]
        if not lv.stable:
            out.append(f"[yellow]{lv.label}: not stable after {lv.windows} windows[/yellow]")
        return out

    def calibration_line(self, cal: dict[str, Any]) -> str:
        return (
            f"calibration: against a null server the tool measures p50 {cal['null_server_p50_us']:.0f} µs, "
            f"p99 {cal['null_server_p99_us']:.0f} µs (its own overhead plus loopback)"
        )

    csv_columns: ClassVar[tuple[str, ...]] = (
        *("p50_us", "p90_us", "p95_us", "p99_us", "p99.9_us", "max_us"),
        "errors",
        "late_sends",
        "late_send_p50_us",
        "client_cpu_share",
        "server_queue_us",
        "server_compute_us",
        "server_avg_batch",
    )

    def csv_row(self, lv: Any) -> list[Any]:
        lat, srv = lv.latency_us, lv.server or {}
        return [
            *(lat.get(k, "") for k in ("p50", "p90", "p95", "p99", "p99.9", "max")),
            sum(lv.errors.values()),
            lv.late_sends,
            round(lv.late_send_p50_us, 1),
            round(lv.client_cpu_share, 3),
            srv.get("queue_us", ""),
            srv.get("compute_us", ""),
            srv.get("avg_batch_size", ""),
        ]


def _null_level(mode: Mode, cfg: BenchConfig, workload: LoadWorkload, workers: int, seconds: float) -> Any:
    """One request in flight against a zero-latency server for ``seconds`` after 0.3 s."""
    pool = WorkerPool(workload, workers)
    try:
        t0 = time.monotonic()
        rec = pool.run_job("closed", 1, seconds, warmup_s=0.3)
        return mode.summarize(cfg, "closed", 1, rec, Window(time.monotonic() - t0, seconds))
    finally:
        pool.close()


class TensorMode(Mode):
    name = "tensor"

    def check(self, cfg: BenchConfig) -> None:
        super().check(cfg)
        if not cfg.model:
            raise ConfigError("the tensor mode needs the model: -m NAME")
        cfg.data = cfg.data or "random"

    def workload(self, cfg: BenchConfig, url: str, extra_body: dict[str, Any]) -> Any:
        w = build_workload(
            parse_target(url),
            cfg.model or "",
            cfg.version,
            cfg.batch,
            cfg.data or "random",
            cfg.shapes,
            cfg.binary,
            zipf=cfg.zipf,
            text_input=cfg.text_input,
        )
        w.split_writes = cfg.split_writes
        return w

    def config_doc(self, cfg: BenchConfig) -> dict[str, Any]:
        return super().config_doc(cfg) | {"binary": cfg.binary, "split_writes": cfg.split_writes}

    def calibrate(self, workers: int) -> dict[str, Any]:
        with fake_server_process() as url:
            lv = _null_level(self, BenchConfig(url), build_workload(parse_target(url), "fake"), workers, 1.0)
        return {
            "null_server_p50_us": lv.latency_us.get("p50"),
            "null_server_p99_us": lv.latency_us.get("p99"),
            "null_server_throughput": round(lv.throughput, 1),
            "note": "HTTP, one request in flight, against a zero-latency server on loopback",
        }


class EmbeddingsMode(Mode):
    name = "embeddings"

    def check(self, cfg: BenchConfig) -> None:
        super().check(cfg)
        cfg.data = cfg.data or "builtin"

    def workload(self, cfg: BenchConfig, url: str, extra_body: dict[str, Any]) -> Any:
        target = parse_api_target(url)
        model = cfg.model or default_embedding_model(target, cfg.api_key)
        texts = load_texts(cfg.data or "builtin")
        return build_embeddings_workload(target, model, texts, cfg.batch, extra_body, cfg.api_key)

    def inputs_per_request(self, cfg: BenchConfig) -> int | None:
        return cfg.batch

    def config_doc(self, cfg: BenchConfig) -> dict[str, Any]:
        return super().config_doc(cfg) | {
            "mode": "embeddings " + ("closed" if cfg.concurrency else "open"),
            "endpoint": "/v1/embeddings",
            "inputs_per_request": cfg.batch,
            "extra_body": cfg.extra_body,
        }

    def title(self, cfg: BenchConfig, kind: str) -> str:
        return f"{cfg.model} @ {cfg.url} (/v1/embeddings, {cfg.batch} text(s) per request, {kind})"

    def columns(self) -> list[Column]:
        cols = super().columns()
        return [cols[0], ("texts/s", lambda lv: f"{lv.inputs_per_s or 0:,.0f}"), *cols[1:]]

    def calibrate(self, workers: int) -> dict[str, Any]:
        with fake_openai_process() as url:
            w = build_embeddings_workload(parse_api_target(url), "fake-embed", load_texts("builtin"))
            lv = _null_level(self, BenchConfig(url, batch=1), w, workers, 1.0)
        return {
            "null_server_p50_us": lv.latency_us.get("p50"),
            "null_server_p99_us": lv.latency_us.get("p99"),
            "null_server_throughput": round(lv.throughput, 1),
            "note": "HTTP, one request of one text in flight, against a zero-latency server on loopback",
        }


class LlmMode(Mode):
    name = "llm"
    median_figure = "e2e_p50"
    compare_figures: ClassVar[dict[str, Callable[[Any], float]]] = {
        "req/s": lambda r: r.throughput,
        "goodput": lambda r: r.goodput,
        "tok/s": lambda r: r.output_tokens_per_s,
        "ttft_p50": lambda r: r.ttft_ms.get("p50", 0.0),
        "ttft_p99": lambda r: r.ttft_ms.get("p99", 0.0),
        "itl_p50": lambda r: r.itl_ms.get("p50", 0.0),
        "itl_p99": lambda r: r.itl_ms.get("p99", 0.0),
        "e2e_p50": lambda r: r.e2e_ms.get("p50", 0.0),
    }
    ratio_figures = ("req/s", "goodput", "tok/s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50")
    compare_values = False

    def check(self, cfg: BenchConfig) -> None:
        super().check(cfg)
        if cfg.stability_pct is not None:
            raise ConfigError("--stability is not used with --llm (give --requests or --duration)")
        if cfg.endpoint not in ENDPOINTS:
            raise ConfigError(f"--endpoint {cfg.endpoint!r}: give one of {sorted(ENDPOINTS)}")
        if cfg.slo_ttft_ms <= 0 or cfg.slo_itl_ms <= 0:
            raise ConfigError("--slo-ttft-ms and --slo-itl-ms must be > 0")
        if cfg.timeout_s <= 0:
            raise ConfigError(f"--request-timeout must be > 0 seconds, got {cfg.timeout_s}")

    def workload(self, cfg: BenchConfig, url: str, extra_body: dict[str, Any]) -> Any:
        target = parse_api_target(url)
        return build_llm_workload(
            target,
            cfg.model or default_model(target, cfg.api_key),
            load_prompts(cfg.prompts),
            cfg.endpoint,
            cfg.max_tokens,
            cfg.temperature,
            extra_body,
            cfg.api_key,
            cfg.timeout_s,
        )

    def summarize(self, cfg: BenchConfig, load: str, level: float, rec: Records, w: Window) -> Level:
        slo = Slo(cfg.slo_ttft_ms, cfg.slo_itl_ms)
        # an open loop's schedule: its measured arrivals were drawn over window_s seconds
        offered = w.window_s if load == "open" and cfg.requests is None else None
        return summarize_llm(load, level, rec, os.cpu_count() or 1, w.run_s, slo, offered)

    def config_doc(self, cfg: BenchConfig) -> dict[str, Any]:
        return {
            "mode": "llm " + ("closed" if cfg.concurrency else "open"),
            "endpoint": ENDPOINTS[cfg.endpoint],
            "prompts": cfg.prompts,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "extra_body": cfg.extra_body,
            "arrivals": "poisson" if cfg.poisson else "constant",
            "seed": cfg.seed,
            "duration_s": cfg.duration_s,
            "warmup_s": cfg.warmup_s,
            "requests": cfg.requests,
            "slo": {"ttft_ms": cfg.slo_ttft_ms, "itl_ms": cfg.slo_itl_ms, "itl_statistic": "p99 per request"},
            "workers": cfg.workers,
        }

    def calibrate(self, workers: int) -> dict[str, Any]:
        """TTFT, ITL and end-to-end p50/p99 against a streaming server with no delays
        (16 one-token chunks written back to back), one request in flight."""
        with fake_openai_process("--tokens", "16") as url:
            prompt = BUILTIN_SETS["chat"][:1]
            w = build_llm_workload(parse_api_target(url), "fake-llm", prompt, max_tokens=16)
            lv = _null_level(self, BenchConfig(url, mode="llm"), w, workers, 1.0)
        return {
            "null_server_ttft_p50_ms": lv.ttft_ms.get("p50"),
            "null_server_ttft_p99_ms": lv.ttft_ms.get("p99"),
            "null_server_itl_p50_ms": lv.itl_ms.get("p50"),
            "null_server_e2e_p50_ms": lv.e2e_ms.get("p50"),
            "note": "HTTP streaming, one request in flight, 16 chunks from a zero-latency server on loopback",
        }

    # ---- the report ----
    def title(self, cfg: BenchConfig, kind: str) -> str:
        where = f"{ENDPOINTS[cfg.endpoint]}, {kind}, max_tokens {cfg.max_tokens}, {cfg.prompts}"
        return f"{cfg.model} @ {cfg.url} ({where})"

    def columns(self) -> list[Column]:
        def three(key: str) -> Callable[[Any], str]:
            def cell(lv: Any) -> str:
                d = getattr(lv, key)
                if not d:
                    return "-"
                return " / ".join(
                    f"{d[k]:,.0f}" if d[k] >= 100 else f"{d[k]:.1f}" for k in ("p50", "p95", "p99")
                )

            return cell

        return [
            ("req/s", lambda lv: f"{lv.throughput:.2f}"),
            ("goodput/s", lambda lv: f"{lv.goodput:.2f}"),
            ("out tok/s", lambda lv: f"{lv.output_tokens_per_s:,.1f}"),
            ("tok/req", lambda lv: f"{lv.output_tokens.get('mean', 0):.0f}"),
            ("TTFT ms p50/95/99", three("ttft_ms")),
            ("ITL ms p50/95/99", three("itl_ms")),
            ("e2e ms p50/95/99", three("e2e_ms")),
            ("errors", lambda lv: f"{sum(lv.errors.values())}"),
            ("client CPU", lambda lv: f"{lv.client_cpu_share:.0%}"),
        ]

    def footer(self, cfg: BenchConfig) -> list[str]:
        return [
            f"goodput: requests/s that met TTFT <= {cfg.slo_ttft_ms:g} ms and, per request, "
            f"ITL p99 <= {cfg.slo_itl_ms:g} ms (--slo-ttft-ms, --slo-itl-ms)"
        ]

    def notes(self, lv: Any) -> list[str]:
        out = []
        if not lv.requests:
            out.append(
                f"[yellow]{lv.label}: no request was measured; raise --duration or --requests[/yellow]"
            )
        if lv.empty:
            out.append(f"[yellow]{lv.label}: {lv.empty} answers had no content (no TTFT)[/yellow]")
        if lv.missed_ttft or lv.missed_itl:
            out.append(
                f"{lv.label}: of {lv.ok - lv.empty} answers, {lv.missed_ttft} missed the TTFT objective "
                f"and {lv.missed_itl} their ITL p99 one"
            )
        if lv.tokens_per_chunk > 1.05:
            out.append(
                f"{lv.label}: chunks carried {lv.tokens_per_chunk:.2f} tokens on average: ITL is per chunk, "
                f"TPOT per token (p50 {lv.tpot_ms.get('p50', 0):.1f} ms)"
            )
        if lv.server:
            figures = ", ".join(f"{k} {v:g}" for k, v in lv.server.items())
            out.append(f"{lv.label}: server reported (mean per request): {figures}")
        return out

    def calibration_line(self, cal: dict[str, Any]) -> str:
        return (
            f"calibration: against a zero-latency streaming server the tool measures TTFT p50 "
            f"{cal['null_server_ttft_p50_ms']:.2f} ms, p99 {cal['null_server_ttft_p99_ms']:.2f} ms "
            "(its own overhead plus loopback)"
        )

    csv_columns: ClassVar[tuple[str, ...]] = (
        "goodput",
        "output_tokens_per_s",
        *(f"{m}_{s}_ms" for m in ("ttft", "itl", "tpot", "e2e") for s in _STATS),
        "output_tokens_mean",
        "tokens_per_chunk",
        "errors",
        "late_sends",
        "client_cpu_share",
    )

    def csv_row(self, lv: Any) -> list[Any]:
        return [
            round(lv.goodput, 3),
            round(lv.output_tokens_per_s, 2),
            *(
                round(d[s], 3) if s in d else ""
                for d in (lv.ttft_ms, lv.itl_ms, lv.tpot_ms, lv.e2e_ms)
                for s in _STATS
            ),
            round(lv.output_tokens.get("mean", 0.0), 2),
            round(lv.tokens_per_chunk, 3),
            sum(lv.errors.values()),
            lv.late_sends,
            round(lv.client_cpu_share, 3),
        ]


MODES: dict[str, Mode] = {m.name: m for m in (TensorMode(), EmbeddingsMode(), LlmMode())}
