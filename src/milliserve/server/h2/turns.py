"""How much of the event loop the HTTP/2 connections of one listener take per turn.

A connection parses what it received one slice at a time: a few hundred frames, and only
the new streams it is given (each starts a call whose decoding and queueing take ~0.1 ms
on the loop). Past its slice it stops reading and waits in line here; each turn of the
loop begins with ``TurnBudget`` handing ``limit`` new streams to the connections in line,
in order, a fair share each, and a connection served goes to the back. So a good client's
call waits for one share of each connection ahead of it, not for every call they sent.

Before (issue 24, item 5): 40 connections sending 990 calls each opened 4,000 calls in a
few turns, and a good client's call waited behind them all (300 ms to 1.5 s); a flood of
10,000 control frames was parsed in one callback.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

__all__ = ["SLICE_FRAMES", "TURN_STREAMS", "Parser", "TurnBudget"]

# frames one connection parses before it lets the loop go on
SLICE_FRAMES = 256
# new streams over all the connections of a listener in one turn of the loop
TURN_STREAMS = 8


class Parser(Protocol):
    def parse_more(self) -> None:
        """Parse another slice of what was received (and wait in line again if more is left)."""


class TurnBudget:
    """The new streams left to open in this turn of the loop, and the connections in line."""

    __slots__ = ("_loop", "_scheduled", "left", "limit", "share", "waiting")

    def __init__(self, limit: int = TURN_STREAMS) -> None:
        self.limit = limit
        self.left = limit
        self.share = limit  # new streams one connection may open before it waits in line
        self.waiting: deque[Parser] = deque()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def spend(self) -> None:
        """One new stream opened."""
        self.left -= 1
        self._schedule()

    def wait(self, conn: Parser) -> None:
        """``conn`` has more to parse: it is served on a coming turn, in its turn."""
        self.waiting.append(conn)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        """The start of a turn: a full budget, and a slice for each connection in line
        (while the budget lasts), in order."""
        self._scheduled = False
        self.left = self.limit
        waiting = self.waiting
        for _ in range(len(waiting)):
            if self.left <= 0:
                break
            self.share = max(1, self.left // len(waiting))
            waiting.popleft().parse_more()
        self.share = self.limit
        if waiting:
            self._schedule()
