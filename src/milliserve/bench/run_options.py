"""What one ``milliserve bench`` run is asked to do: the target, the mode, the load, and
each mode's request options (the command line's flags, as a library call takes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from milliserve.errors import ConfigError

__all__ = ["BenchConfig"]


@dataclass
class BenchConfig:
    """One run: the target, the mode, the load, and each mode's request options."""

    url: str
    model: str | None = None  # llm, embeddings: None asks GET /v1/models for the first
    mode: str = "tensor"  # tensor, llm or embeddings
    # the load
    concurrency: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    poisson: bool = True
    # the open loop's arrivals are drawn from this and the level: the same seed replays the
    # same schedule, so rounds that should sample different arrivals each take their own
    seed: int = 0
    duration_s: float | None = None  # None: 5 s, or 20 s for llm
    warmup_s: float = 1.0
    requests: int | None = None  # llm: measure this many requests per level instead
    stability_pct: float | None = None  # set: windows of window_s until 3 agree within this
    window_s: float = 2.0
    max_windows: int = 10
    workers: int = 0  # 0: DEFAULT_WORKERS (see client_workers)
    compare_url: str | None = None
    rounds: int = 3
    calibrate: bool = True  # measure the tool against a zero-latency server first
    # tensor and embeddings
    batch: int = 1  # tensor: the batch dimension; embeddings: texts per request
    data: str | None = (
        None  # tensor: random (default), zero, FILE.json or FILE.txt; embeddings: builtin or FILE.txt
    )
    metrics_url: str | None = None
    # tensor
    version: str = ""
    zipf: float | None = None  # with data FILE.txt: a Zipf stream over its texts
    text_input: str | None = None  # with data FILE.txt: the BYTES input (default from metadata)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    binary: bool = True
    split_writes: bool = False  # HTTP: head and body in two sends, like libcurl
    cold_start: bool = False  # unload + load through the repository API first
    # llm and embeddings
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    # llm
    endpoint: str = "chat"
    prompts: str = "builtin:chat"
    max_tokens: int = 128
    temperature: float = 0.0
    compare_extra_body: dict[str, Any] | None = None  # B's requests: extra_body updated with this
    slo_ttft_ms: float = 1000.0
    slo_itl_ms: float = 100.0
    timeout_s: float = 300.0

    def check(self) -> None:
        """Raise ConfigError for arguments that cannot work in any mode, naming them; fill the
        defaults (each mode checks its own options: modes.py)."""
        if self.mode not in ("tensor", "llm", "embeddings"):
            raise ConfigError(f"mode {self.mode!r}: give tensor, llm or embeddings")
        if self.compare_extra_body is not None and not self.compare_url:
            self.compare_url = self.url  # the same server, with B's request options
        if not self.concurrency and not self.rates:
            self.concurrency = [1]
        if self.concurrency and self.rates:
            raise ConfigError("give --concurrency or --rate, not both")
        if any(c < 1 for c in self.concurrency):
            raise ConfigError(f"--concurrency values must be >= 1, got {self.concurrency}")
        if any(r <= 0 for r in self.rates):
            raise ConfigError(f"--rate values must be > 0 requests per second, got {self.rates}")
        if self.duration_s is None:
            self.duration_s = 20.0 if self.mode == "llm" else 5.0
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ConfigError("--duration must be > 0 and --warmup >= 0 seconds")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.rounds < 1:
            raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")

    def levels(self) -> list[tuple[str, float]]:
        return [("closed", float(c)) for c in self.concurrency] or [("open", float(r)) for r in self.rates]
