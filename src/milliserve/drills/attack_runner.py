"""The frame every attack runs in: the target, a catalogue entry, and the loop that runs
each entry with the good clients calling beside it (``drills/bystanders.py``).

An attack's window opens at its first request and closes when the server is quiet again
(its CPU back to what the good clients alone cost, :func:`wait_until_quiet`): the work an
attack leaves behind (a batch still computing for clients that left, megabytes being
freed) is that attack's cost, counted in its row, not in the next attack's. The catalogues
are ``drills/tensor_attacks.py`` (tensor inputs) and ``drills/h2_attacks.py`` (HTTP/2 frames).
"""

from __future__ import annotations

import http.client
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from milliserve.drills.bystanders import Bystanders, Waits
from milliserve.drills.process_probe import cpu_rate, cpu_seconds, rss_bytes, wait_until_quiet

__all__ = ["Attack", "AttackResult", "Target", "attack", "run_attacks"]


@dataclass(frozen=True)
class Target:
    host: str
    http_port: int
    grpc_port: int
    pid: int
    metrics_port: int = 0  # where the per-worker metrics are, if known


@dataclass(frozen=True)
class Attack:
    name: str
    send: Callable[[Target], str]
    expect: frozenset[str]  # statuses (HTTP) or gRPC code names that are correct
    repeat: int = 1
    what: str = ""
    # runs before the window opens: builds what ``send`` sends, or brings the server to where
    # a legitimate client could have brought it (its memory included)
    prepare: Callable[[Target], object] | None = None


def attack(
    name: str,
    send: Callable[[Target], str],
    expect: set[str],
    repeat: int = 1,
    prepare: Callable[[Target], object] | None = None,
) -> Attack:
    """An entry of the catalogue; its description is the first paragraph of ``send``'s docstring."""
    what = " ".join((send.__doc__ or "").strip().split("\n\n")[0].split())
    return Attack(name, send, frozenset(expect), repeat, what, prepare)


@dataclass
class AttackResult:
    name: str
    statuses: Counter[str] = field(default_factory=Counter)
    worst_s: float = 0.0
    seconds: float = 0.0  # from the first request sent to the last answer
    settle_s: float = 0.0  # from the last answer until the server was quiet again
    settled: bool = True  # quiet again within the timeout
    rss_growth: int = 0
    cpu_s: float = 0.0  # the server's CPU time from the first request until it was quiet
    # the good clients: HTTP (a request every 2 ms) and gRPC (a call every 100 ms)
    good: Waits = field(default_factory=Waits)
    grpc: Waits = field(default_factory=Waits)

    @property
    def stall_s(self) -> float:
        """The longest a good client waited for an answer while the attack ran."""
        return max(self.good.worst_s, self.grpc.worst_s)

    def ok(self, attack: Attack) -> bool:
        return set(self.statuses) <= attack.expect and not self.good.failed and not self.grpc.failed


def run_attacks(
    target: Target,
    attacks: tuple[Attack, ...],
    progress: Callable[[str], None] | None = None,
    bystanders: Bystanders | None = None,
    settle_timeout_s: float = 20.0,
) -> list[AttackResult]:
    """Run each attack (its repeats back to back) with the good clients calling meanwhile
    (``bystanders``, or ones started here for ``target``); each window lasts until the server
    is as quiet as it was with the good clients alone, measured first."""
    if bystanders is None:
        with Bystanders(target.host, target.http_port, target.grpc_port) as good:
            return run_attacks(target, attacks, progress, good, settle_timeout_s)
    quiet = cpu_rate(target.pid, 1.0)  # what the good clients alone cost the server
    results = []
    for attack in attacks:
        if progress:
            progress(attack.name)
        if attack.prepare is not None:
            attack.prepare(target)
            wait_until_quiet(target.pid, quiet, settle_timeout_s)
        res = AttackResult(attack.name)
        before = rss_bytes(target.pid)
        cpu_before = cpu_seconds(target.pid)
        start = time.perf_counter()
        for _ in range(attack.repeat):
            t0 = time.perf_counter()
            try:
                status = attack.send(target)
            except (OSError, http.client.HTTPException) as exc:
                status = f"error: {exc!r}"
            res.worst_s = max(res.worst_s, time.perf_counter() - t0)
            res.statuses[status] += 1
        sent = time.perf_counter()
        res.settled = wait_until_quiet(target.pid, quiet, settle_timeout_s)
        end = time.perf_counter()
        res.seconds, res.settle_s = sent - start, end - sent
        res.cpu_s = cpu_seconds(target.pid) - cpu_before
        res.rss_growth = max(0, rss_bytes(target.pid) - before)
        waits = bystanders.window(start, end)
        res.good, res.grpc = waits["http"], waits["grpc"]
        results.append(res)
    return results
