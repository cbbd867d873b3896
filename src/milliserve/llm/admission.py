"""Who gets the next free sequence slot: one admission policy for priority and fairness.

Waiting requests are ordered by priority level first (level 0, a request's ``priority:
1``, before level 1...). Within a level, the client holding the fewest slots goes next
(its oldest request first), so one client's flood waits behind everyone else's first
requests instead of in front of them; a client is its peer's address (see
docs/llm.md). Requests that come back from preemption go to the front of their
client's line.

Preemption is a stage of its own (``Preemption``), off for priority unless configured:

- ``fair`` (the default): when no slot is free, a client waits and another client holds
  more than its share of the slots (the slots over the clients that are running or
  waiting), one of that client's sequences is suspended (its KV saved to host memory)
  and the waiting client takes the slot. A suspended stream pauses, then resumes where
  it was; nothing is lost or recomputed. A sequence runs at least ``QUANTUM`` tokens
  between suspensions, so that two clients do not trade a slot every step;
- ``priority``: as ``fair``, and a waiting request also suspends a running sequence of a
  lower priority level;
- ``off``: never.

Everything here runs on the engine thread, except ``snapshot`` and the counts, which
the event loop reads without a lock (copies of small containers).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Iterator
from typing import TYPE_CHECKING

from milliserve.llm.sequence import GenRequest

if TYPE_CHECKING:
    from milliserve.llm.sequence import Sequence

__all__ = ["PREEMPTION_MODES", "QUANTUM", "Preemption", "WaitingRoom", "evictable", "fair_claim"]

# tokens a sequence generates after it was admitted or resumed before fairness may suspend it
QUANTUM = 16
PREEMPTION_MODES = ("fair", "priority", "off")


class WaitingRoom:
    """The waiting requests: level -> client -> FIFO, and the slots each client holds."""

    def __init__(self) -> None:
        self._levels: dict[int, dict[str, deque[GenRequest]]] = {}
        self.running: dict[str, int] = {}  # client -> slots it holds
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def push(self, req: GenRequest, front: bool = False) -> None:
        line = self._levels.setdefault(req.level, {}).setdefault(req.client, deque())
        if front:
            line.appendleft(req)
        else:
            line.append(req)
        self._n += 1

    def _next(self) -> tuple[dict[str, deque[GenRequest]], str] | None:
        if not self._n:
            return None
        level = min(lv for lv, clients in self._levels.items() if clients)
        clients = self._levels[level]
        running = self.running
        client = min(clients, key=lambda c: (running.get(c, 0), clients[c][0].arrival))
        return clients, client

    def head(self) -> GenRequest | None:
        """The request that takes the next free slot."""
        found = self._next()
        return None if found is None else found[0][found[1]][0]

    def pop(self) -> GenRequest | None:
        found = self._next()
        if found is None:
            return None
        clients, client = found
        line = clients[client]
        req = line.popleft()
        if not line:
            del clients[client]
        self._n -= 1
        return req

    def take_cancelled(self) -> list[GenRequest]:
        gone: list[GenRequest] = []
        for clients in self._levels.values():
            for client, line in list(clients.items()):
                if any(r.cancelled for r in line):
                    gone += [r for r in line if r.cancelled]
                    kept = deque(r for r in line if not r.cancelled)
                    if kept:
                        clients[client] = kept
                    else:
                        del clients[client]
        self._n -= len(gone)
        return gone

    def drain(self) -> list[GenRequest]:
        out = [r for clients in self._levels.values() for line in clients.values() for r in line]
        self._levels.clear()
        self._n = 0
        return out

    def started(self, client: str) -> None:
        self.running[client] = self.running.get(client, 0) + 1

    def ended(self, client: str) -> None:
        left = self.running.get(client, 0) - 1
        if left > 0:
            self.running[client] = left
        else:
            self.running.pop(client, None)

    # ---- read from the event loop (snapshots, no lock) ----
    def snapshot(self) -> list[tuple[int, str, list[GenRequest]]]:
        """(level, client, waiting requests) for every line, copied."""
        return [
            (level, client, list(line))
            for level, clients in list(self._levels.items())
            for client, line in list(clients.items())
        ]

    def clients(self) -> set[str]:
        """Clients that hold a slot or wait for one."""
        out = set(self.running)
        for clients in list(self._levels.values()):
            out.update(list(clients))
        return out


def ahead_of(
    lines: list[tuple[int, str, list[GenRequest]]], client: str, level: int, held: dict[str, int]
) -> Iterator[GenRequest]:
    """The waiting requests a new request of ``client`` at ``level`` would wait behind:
    every one of a higher level; of its own level, its client's, and of each other client
    those that take their turns first (the client holding fewer slots goes first: a
    client that holds more than this one waits behind it)."""
    mine = sum(len(reqs) for lv, c, reqs in lines if lv == level and c == client)
    turns = mine + 1 + held.get(client, 0)
    for lv, c, reqs in lines:
        if lv < level or (lv == level and c == client):
            yield from reqs
        elif lv == level:
            yield from reqs[: max(0, turns - held.get(c, 0))]


def evictable(
    waiting: list[GenRequest], client: str, share: int, suspended: Container[GenRequest]
) -> GenRequest | None:
    """The request to evict from a full queue so that ``client`` gets in: the latest
    ``waiting`` request of the client with the most waiting, if that client has more than
    ``share`` waiting and ``client`` fewer. Never a suspended sequence (a stream under
    way) nor one already cancelled."""
    counts: dict[str, list[GenRequest]] = {}
    for r in waiting:
        if not r.cancelled and r not in suspended:
            counts.setdefault(r.client, []).append(r)
    if len(counts.get(client, ())) >= share:
        return None
    over = max((c for c in counts if c != client), key=lambda c: len(counts[c]), default=None)
    if over is None or len(counts[over]) <= share:
        return None
    return max(counts[over], key=lambda r: r.arrival)


def fair_claim(client: str, held: dict[str, int], clients: set[str], max_sequences: int) -> bool:
    """Whether ``client`` holds fewer slots than its share while another client holds more
    (``held``: slots by client; ``clients``: those running or waiting). Such a client is
    next for a slot (it holds fewer), and admission never refuses it by estimate: the
    other client's excess is what its wait is made of (docs/llm.md)."""
    share = -(-max_sequences // max(1, len(clients | {client})))
    return held.get(client, 0) < share and any(n > share for c, n in held.items() if c != client)


class Preemption:
    """Chooses the running sequence to suspend so that the head of the queue can run."""

    def __init__(self, mode: str, max_sequences: int) -> None:
        if mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption mode {mode!r} is not one of {list(PREEMPTION_MODES)}")
        self.fair = mode in ("fair", "priority")
        self.priority = mode == "priority"
        self.max_sequences = max_sequences

    def share(self, room: WaitingRoom) -> int:
        """Slots each client may hold while others want one."""
        return math.ceil(self.max_sequences / max(1, len(room.clients())))

    def victim(self, head: GenRequest, running: list[Sequence], room: WaitingRoom) -> Sequence | None:
        if self.priority:
            lower = [s for s in running if s.req.level > head.level and s.decoding]
            if lower:  # the lowest level, the latest admitted
                return max(lower, key=lambda s: (s.req.level, s.admitted))
        if not self.fair:
            return None
        share = self.share(room)
        held = room.running
        if held.get(head.client, 0) >= share:
            return None
        over = [
            s
            for s in running
            if held.get(s.req.client, 0) > share
            and s.req.level >= head.level
            and s.decoding
            and s.generated - s.ran_from >= QUANTUM
        ]
        if not over:
            return None
        return max(over, key=lambda s: (held.get(s.req.client, 0), s.admitted))

    def would_preempt(self, client: str, level: int, running: list[Sequence], room: WaitingRoom) -> bool:
        """Whether a request of ``client`` at ``level`` would suspend a running sequence
        rather than wait for one to end (a snapshot for estimates; ``victim`` decides)."""
        if self.priority and any(s.req.level > level for s in running):
            return True
        if not self.fair:
            return False
        return fair_claim(client, dict(room.running), room.clients(), self.max_sequences)
