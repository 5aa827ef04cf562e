"""The bounded pool's slots, for :class:`~toolnexus_async.AiohttpTransport`: a FIFO queue of
requests waiting for a connection of their own."""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ("Slots",)


class Slots:
    """The pool's slots: taken without a wait while one is free, else handed over in FIFO
    order as they come free.

    Not ``asyncio.Semaphore``: its release wakes the first waiter not yet done by walking
    the waiters from the front, past every one woken earlier in the same loop iteration and
    not yet resumed, which with thousands queued (a burst of runs, each to park) costs
    quadratic time per iteration. Here a freed slot goes to the waiter popped off the front;
    a waiter that gave up is skipped when it is popped.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        """Take a free slot, if there is one. (While one is free, nobody waits: a freed
        slot goes to a waiter first.)"""
        if self._free:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot to be handed over."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot, then cancelled before it resumed: pass it on
            else:
                waiter.cancel()  # skipped when its turn comes
            raise

    def give(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to the free ones."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
