"""The frame every attack runs in: a catalogue entry, its result, and the one loop that
runs each entry (tensor inputs, HTTP/2 frames, generation requests alike) with the good
clients calling beside it from a process of their own (``drills/bystanders.py``).

**The window.** An attack's window opens at its first request and closes when the server
is quiet again: its CPU back to what the good clients alone cost it (measured first), and,
on a generation server (a target with ``metrics_url``), no sequence running
(``window_closed``). The work an attack leaves behind (a batch still computing for clients
that left, megabytes being freed, sequences still generating for clients that left) is that
attack's cost, counted in its row, not in the next attack's. The good clients' waits are
their requests that overlapped the window, and the first one after it.

The catalogues are ``drills/tensor_attacks.py`` (tensor inputs), ``drills/h2_attacks.py``
(HTTP/2 frames) and ``drills/llm_attacks.py`` (generation endpoints).
"""

from __future__ import annotations

import http.client
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from milliserve.drills.bystanders import Bystanders, Waits
from milliserve.drills.generation_wire import metric
from milliserve.drills.process_probe import cpu_rate, cpu_seconds, rss_bytes, wait_until_quiet
from milliserve.drills.target import Target

__all__ = ["Attack", "AttackResult", "Target", "attack", "run_attacks", "window_closed"]

RUNNING = "milliserve_generation_running"


@dataclass(frozen=True)
class Attack:
    name: str
    # what one repeat sent: its answer (a status, a gRPC code name, how a connection ended),
    # or the answers of its many requests, counted
    send: Callable[[Target], str | Counter[str]]
    expect: frozenset[str]  # statuses (HTTP) or gRPC code names that are correct
    repeat: int = 1
    what: str = ""
    # runs before the window opens: builds what ``send`` sends, or brings the server to where
    # a legitimate client could have brought it (its memory included)
    prepare: Callable[[Target], object] | None = None


def attack(
    name: str,
    send: Callable[[Target], str | Counter[str]],
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
    # what each good client saw in the window, by name (bystanders.CLIENTS)
    waits: dict[str, Waits] = field(default_factory=dict)
    # a generation server's sequences still running when the window closed (at its timeout)
    running_after: float = 0.0

    @property
    def good(self) -> Waits:
        """The good HTTP client's (a request every 2 ms)."""
        return self.waits.get("http", Waits())

    @property
    def grpc(self) -> Waits:
        """The good gRPC client's (a call every 100 ms)."""
        return self.waits.get("grpc", Waits())

    @property
    def stream(self) -> Waits:
        """The good streaming client's (a short chat every 0.2 s; its wait is the time to
        its first token)."""
        return self.waits.get("stream", Waits())

    @property
    def stall_s(self) -> float:
        """The longest a good client waited for an answer while the attack ran."""
        return max((w.worst_s for w in self.waits.values()), default=0.0)

    def ok(self, attack: Attack) -> bool:
        """Answered as expected, no good request failed, every good client was answered in
        the window, and no sequence was left running."""
        return (
            set(self.statuses) <= attack.expect
            and all(not w.failed and w.answered for w in self.waits.values())
            and self.running_after == 0
        )


def window_closed(target: Target, quiet_rate: float, timeout_s: float) -> bool:
    """Wait for the rule that closes every attack's window: the server's CPU back to
    ``quiet_rate`` (what the good clients alone cost it) and, on a generation server, no
    sequence running. False if that did not happen within ``timeout_s``."""
    idle = None
    if target.metrics_url:
        url = target.metrics_url
        idle = lambda: metric(url, RUNNING) == 0  # noqa: E731
    return wait_until_quiet(target.pid, quiet_rate, timeout_s, idle=idle)


def run_attacks(
    target: Target,
    attacks: tuple[Attack, ...],
    progress: Callable[[str], None] | None = None,
    bystanders: Bystanders | None = None,
    settle_timeout_s: float = 20.0,
    clients: tuple[str, ...] = ("http", "grpc"),
) -> list[AttackResult]:
    """Run each attack (its repeats back to back) with the good clients calling meanwhile
    (``bystanders``, or ``clients`` started here for ``target``: ``("stream",)`` for a
    generation server); each window lasts until the server is as quiet as it was with the
    good clients alone, measured first (``window_closed``)."""
    if bystanders is None:
        with Bystanders(target, clients) as good:
            return run_attacks(target, attacks, progress, good, settle_timeout_s)
    quiet = cpu_rate(target.pid, 1.0)  # what the good clients alone cost the server
    results = []
    for attack in attacks:
        if progress:
            progress(attack.name)
        if attack.prepare is not None:
            attack.prepare(target)
            window_closed(target, quiet, settle_timeout_s)
        res = AttackResult(attack.name)
        before = rss_bytes(target.pid)
        cpu_before = cpu_seconds(target.pid)
        start = time.perf_counter()
        for _ in range(attack.repeat):
            t0 = time.perf_counter()
            try:
                got = attack.send(target)
            except (OSError, http.client.HTTPException) as exc:
                got = f"error: {exc!r}"
            res.worst_s = max(res.worst_s, time.perf_counter() - t0)
            res.statuses.update([got] if isinstance(got, str) else got)
        sent = time.perf_counter()
        res.settled = window_closed(target, quiet, settle_timeout_s)
        end = time.perf_counter()
        res.seconds, res.settle_s = sent - start, end - sent
        res.cpu_s = cpu_seconds(target.pid) - cpu_before
        res.rss_growth = max(0, rss_bytes(target.pid) - before)
        if target.metrics_url and not res.settled:  # settled: none was running when it closed
            res.running_after = metric(target.metrics_url, RUNNING)
        res.waits = bystanders.window(start, end)
        results.append(res)
    return results
