"""Generative models loaded on their first request and unloaded when idle, under a memory cap
(``--llm-memory-mib``): several GGUF models behind one port.

With a cap set, the repository's generative models are not loaded at start; each is
listed (``GET /v1/models``, status ``unloaded``) and loads when a request names it. Before a
load, idle generative models are unloaded, least recently used first, while the resident
memory of those loaded plus what the new one is expected to take would pass the cap. What a
model takes is measured, not guessed: the process's resident set before and after its load
(loads run one at a time, so the difference is that model's weights as llama.cpp mapped and
warmed them, and its context). A model not loaded before is expected to take its files'
size until it has been measured. A model with requests running or waiting is never
unloaded: a load that needs its room waits until it is idle (up to ``WAIT_S``, then 503).
A model being loaded is never loaded twice: the second request waits for the first's load.

Everything here runs on the event loop; the registry does the loading and unloading.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from milliserve.errors import QueueFullError

__all__ = ["OnDemand", "resident_bytes"]

log = logging.getLogger(__name__)

# how long a load waits for a busy model to become idle so that it can be unloaded
WAIT_S = 120.0
_POLL_S = 0.05


def resident_bytes() -> int:
    """This process's resident set size (Linux's /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(slots=True)
class _Model:
    last_used: float = 0.0
    measured: int = 0  # resident bytes its last load added (0: never loaded)
    loads: int = 0


@dataclass(slots=True)
class OnDemand:
    """The cap, the models' last use and measured sizes, and the load lock."""

    cap_bytes: int
    wait_s: float = WAIT_S  # how long a load waits for a busy model to become idle
    models: dict[str, _Model] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loads: int = 0
    unloads: int = 0

    def touch(self, name: str) -> None:
        self.models.setdefault(name, _Model()).last_used = time.monotonic()

    def expected(self, name: str, files: Path) -> int:
        """Bytes ``name`` is expected to take: as measured at its last load, else its files."""
        known = self.models.get(name)
        if known is not None and known.measured:
            return known.measured
        return sum(p.stat().st_size for p in files.rglob("*") if p.is_file())

    async def make_room(
        self,
        name: str,
        need: int,
        loaded: Callable[[], list[str]],
        size: Callable[[str], int],
        busy: Callable[[str], bool],
        unload: Callable[[str], Awaitable[None]],
    ) -> None:
        """Unload idle models, least recently used first, until ``need`` more bytes fit under
        the cap beside the loaded ones (``size``: what each takes, ``expected``); wait for a
        busy one to become idle when only busy ones are left. A model alone may pass the cap
        (nothing else to unload)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            others = [n for n in loaded() if n != name]
            if not others or sum(size(n) for n in others) + need <= self.cap_bytes:
                return
            idle = [n for n in others if not busy(n)]
            if idle:
                victim = min(idle, key=lambda n: self.models.get(n, _Model()).last_used)
                log.info(
                    "unloading %s (idle, least recently used) to load %s under llm_memory_mib %d",
                    victim,
                    name,
                    self.cap_bytes >> 20,
                )
                await unload(victim)
                self.unloads += 1
                continue
            if time.monotonic() > deadline:
                raise QueueFullError(
                    f"model {name!r} cannot be loaded: with {sorted(others)} loaded and busy it would "
                    f"pass llm_memory_mib ({self.cap_bytes >> 20} MiB); retry later"
                )
            await asyncio.sleep(_POLL_S)

    def measured(self, name: str, added: int) -> None:
        m = self.models.setdefault(name, _Model())
        m.measured = max(added, 1)
        m.loads += 1
        self.loads += 1
