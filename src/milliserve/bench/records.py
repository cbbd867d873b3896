"""What the load generator keeps of every request, whatever the mode: the instant it was
*scheduled*, the instant it went out and the instant its answer ended (all on the system-wide
monotonic clock, so that worker processes and a server on the same machine can be compared),
its status, and the phase it belongs to. A streamed answer (the LLM mode) adds the arrival
of each content chunk and its tokens.

Statuses: an HTTP status, 1000 + a gRPC code, or one of the client's negative codes
(``CONNECT_ERROR`` for all modes; the streaming client adds its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milliserve.bench.llm_stream import StreamTally

__all__ = ["CONNECT_ERROR", "COOLDOWN", "MEASURED", "WARMUP", "Recorder", "Records", "Streams"]

CONNECT_ERROR = -1
# the phases of a level (loadgen.Phases): only MEASURED requests are summarised; the others
# keep the load the same before and after them
WARMUP, MEASURED, COOLDOWN = 0, 1, 2

Array = np.ndarray[Any, Any]
_COLUMNS = ("intended", "sent", "done", "status", "phase")


@dataclass
class Streams:
    """Per request of a streamed answer; chunk arrays are flat, request i owning
    ``chunk_t[offsets[i]:offsets[i + 1]]``."""

    output_tokens: Array
    usage_known: Array  # the server reported completion_tokens
    chunk_known: Array  # chunk_tokens came from the server per chunk
    offsets: Array  # len(requests) + 1
    chunk_t: Array
    chunk_tokens: Array  # each chunk's share of the output tokens
    timings: list[dict[str, float]] = field(default_factory=list)

    @staticmethod
    def merge(parts: list[Streams]) -> Streams:
        shift = np.cumsum([0] + [p.chunk_t.size for p in parts[:-1]])
        offsets = np.concatenate(
            [np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, shift, strict=True)]
        )

        def cat(name: str) -> Array:
            return np.concatenate([getattr(p, name) for p in parts])

        return Streams(
            cat("output_tokens"),
            cat("usage_known"),
            cat("chunk_known"),
            offsets,
            cat("chunk_t"),
            cat("chunk_tokens"),
            [t for p in parts for t in p.timings],
        )


@dataclass
class Records:
    """Every request of one run (one job, or several merged)."""

    intended: Array
    sent: Array
    done: Array
    status: Array
    phase: Array
    messages: dict[int, str] = field(default_factory=dict)  # first error message per status
    cpu_s: float = 0.0  # the client processes' CPU time over the run
    streams: Streams | None = None

    def __len__(self) -> int:
        return int(self.intended.size)

    @property
    def measured(self) -> Array:
        keep: Array = self.phase == MEASURED
        return keep

    @staticmethod
    def merge(parts: list[Records]) -> Records:
        messages: dict[int, str] = {}
        for p in parts:
            for k, v in p.messages.items():
                messages.setdefault(k, v)
        streams = [p.streams for p in parts if p.streams is not None]
        intended, sent, done, status, phase = (
            np.concatenate([getattr(p, k) for p in parts]) for k in _COLUMNS
        )
        return Records(
            intended,
            sent,
            done,
            status,
            phase,
            messages=messages,
            cpu_s=sum(p.cpu_s for p in parts),
            streams=Streams.merge(streams) if len(streams) == len(parts) and streams else None,
        )


class Recorder:
    """Collects one worker's requests as they end; ``records`` turns them into arrays."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, int, int]] = []
        self.messages: dict[int, str] = {}
        self.tallies: list[StreamTally] = []

    def add(
        self,
        intended: float,
        phase: int,
        sent: float,
        done: float,
        status: int,
        message: str = "",
        tally: StreamTally | None = None,
    ) -> None:
        self.rows.append((intended, sent, done, status, phase))
        if message and status not in self.messages:
            self.messages[status] = message[:300]
        if tally is not None:
            self.tallies.append(tally)

    def records(self, cpu_s: float) -> Records:
        a = np.asarray(self.rows, dtype=np.float64).reshape(-1, 5)
        return Records(
            a[:, 0],
            a[:, 1],
            a[:, 2],
            a[:, 3].astype(np.int32),
            a[:, 4].astype(np.int8),
            self.messages,
            cpu_s,
            _streams(self.tallies) if self.tallies else None,
        )


def _streams(tallies: list[StreamTally]) -> Streams:
    chunk_t: list[float] = []
    chunk_tokens: list[float] = []
    offsets = [0]
    known = []
    for t in tallies:
        shares = t.per_chunk_tokens()
        known.append(bool(shares) and len(t.chunk_tokens) == len(shares))
        chunk_t += t.chunk_times
        chunk_tokens += shares
        offsets.append(len(chunk_t))
    return Streams(
        np.asarray([t.output_tokens for t in tallies], np.int64),
        np.asarray([t.completion_tokens is not None for t in tallies], bool),
        np.asarray(known, bool),
        np.asarray(offsets, np.int64),
        np.asarray(chunk_t, np.float64),
        np.asarray(chunk_tokens, np.float64),
        [t.timings for t in tallies],
    )
