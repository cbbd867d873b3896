"""What a server process costs, read from /proc: its tree (a server and its workers), their
CPU time and resident memory, and when the server is quiet again after an attack
(``wait_until_quiet``: the rule that closes an attack's window, attack_runner.py)."""

from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["cpu_rate", "cpu_seconds", "rss_bytes", "tree", "wait_until_quiet", "workers_of"]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids[ppid].append(int(entry.name))
    return kids


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a server and its workers)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def workers_of(pid: int) -> list[int]:
    """The worker processes of a ``serve --workers N`` parent."""
    out = []
    for p in _children().get(pid, []):
        try:
            if b"worker_process" in Path(f"/proc/{p}/cmdline").read_bytes():
                out.append(p)
        except OSError:
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` and its descendants have used (from /proc)."""
    total = 0.0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cpu_rate(pid: int, seconds: float) -> float:
    """The CPUs ``pid`` and its descendants used on average over the next ``seconds``."""
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)


def wait_until_quiet(
    pid: int,
    quiet_rate: float,
    timeout_s: float = 20.0,
    sample_s: float = 0.25,
    idle: Callable[[], bool] | None = None,
) -> bool:
    """Wait until the server has used no more CPU than ``quiet_rate`` (measured beforehand
    with the same clients calling, by :func:`cpu_rate`) with some slack, over two samples in a
    row: the work an attack left behind (batches computing for clients that left, buffers
    being freed) is over; with ``idle``, that must hold at the end of the second sample too
    (a generation server's running sequences: none). False if it was still busy after
    ``timeout_s``."""
    # a sample of 0.25 s sees CPU time in clock ticks (10 ms): a tick or two is noise
    limit = quiet_rate * 1.5 + 2.5 / os.sysconf("SC_CLK_TCK") / sample_s
    cpu, now = cpu_seconds(pid), time.perf_counter()
    end, calm = now + timeout_s, 0
    while now < end:  # samples back to back: each one's end reading is the next one's start
        time.sleep(sample_s)
        cpu_then, then = cpu, now
        cpu, now = cpu_seconds(pid), time.perf_counter()
        calm = calm + 1 if (cpu - cpu_then) / (now - then) <= limit else 0
        if calm >= 2 and (idle is None or idle()):
            return True
    return False


def rss_bytes(pid: int) -> int:
    """The resident memory of ``pid`` and its descendants."""
    total = 0
    for p in tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        total += int(found.group(1)) * 1024 if found else 0
    return total
