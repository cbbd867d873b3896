"""The engine thread's events reach their queues in order, and the loop is woken once for
all the events put while it was busy (llm/outbox.py)."""

from __future__ import annotations

import asyncio
import threading

from milliserve.llm.outbox import Outbox, outbox_of


def test_events_put_while_the_loop_is_busy_arrive_in_order_after_one_wake_up() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        box = Outbox(loop)
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(*args: object) -> object:
            nonlocal wakes
            wakes += 1
            return real(*args)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(3)]
        done = threading.Event()

        def engine() -> None:
            for i in range(300):
                box.put(queues[i % 3], i)
            done.set()

        threading.Thread(target=engine).start()
        done.wait(60)  # the loop is held here: every put above found a drain due
        assert wakes == 1
        got = [[await q.get() for _ in range(100)] for q in queues]
        assert got == [list(range(k, 300, 3)) for k in range(3)]
        # once drained, the next put wakes the loop again
        box.put(queues[0], -1)
        assert await asyncio.wait_for(queues[0].get(), 60) == -1
        assert wakes == 2

    asyncio.run(main())


def test_puts_racing_the_drain_are_never_lost() -> None:
    async def main() -> None:
        q: asyncio.Queue[int] = asyncio.Queue()
        box = outbox_of(asyncio.get_running_loop())
        assert outbox_of(asyncio.get_running_loop()) is box
        n = 20000

        def engine() -> None:
            for i in range(n):
                box.put(q, i)

        t = threading.Thread(target=engine)
        t.start()
        got = [await asyncio.wait_for(q.get(), 60) for _ in range(n)]
        t.join()
        assert got == list(range(n))

    asyncio.run(main())
