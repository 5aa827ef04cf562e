"""``Deadlines``: the deadlines of many parked requests on one timer.

Rules of this module:

- One timer for all of them, not a sleeping task per request: the deadlines sit in a heap
  and a single ``loop.call_at`` handle fires for the earliest one.
- It keeps no request and decides nothing: its owner (the ``Inbox``) is told each entry
  that falls due, says whether the entry was still live and how many of that request's
  other entries it leaves behind, and tells it of the entries a request left with
  (``dropped``).
- Entries that are no longer live are removed lazily but boundedly: once they are at
  least half the heap it is rebuilt, so the heap never holds more than twice the live
  entries, and none (and no timer) once nothing live is left.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable

__all__ = ("Deadlines",)

# due(number, key): the entry fell due. None if it was not live any more (skipped);
# otherwise how many more of the key's entries it leaves stale.
Due = Callable[[int, str], "int | None"]
# live(number, key): whether the entry is still its key's.
Live = Callable[[int, str], bool]


class Deadlines:
    """A heap of ``(when, number, key)`` and the one timer for its earliest entry."""

    __slots__ = ("_due", "_heap", "_live", "_loop", "_order", "_stale", "_timer", "_timer_at")

    def __init__(self, due: Due, live: Live) -> None:
        self._due = due
        self._live = live
        self._heap: list[tuple[float, int, str]] = []
        self._stale = 0  # entries no longer live
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, loop: asyncio.AbstractEventLoop, when: float, key: str) -> int:
        """An entry for ``key`` due at ``when`` (``loop.time()``); returns its number."""
        self._loop = loop
        number = next(self._order)
        heapq.heappush(self._heap, (when, number, key))
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = loop.call_at(when, self._fire)
        return number

    def dropped(self, count: int) -> None:
        """``count`` entries are no longer live; the heap is rebuilt once they pile up."""
        self._stale += count
        if self._stale * 2 < len(self._heap):
            return
        live = self._live
        self._heap = [entry for entry in self._heap if live(entry[1], entry[2])]
        heapq.heapify(self._heap)
        self._stale = 0
        if not self._heap and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf

    def _fire(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        self._timer_at = math.inf
        # asyncio may fire a timer up to its clock resolution early; count that as due.
        now = loop.time() + time.get_clock_info("monotonic").resolution
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, number, key = heapq.heappop(heap)
            # Not compacted here (this loop walks the heap): the stale entries are counted.
            left_stale = self._due(number, key)
            if left_stale is None:
                self._stale = max(0, self._stale - 1)
            else:
                self._stale += left_stale
        if heap and self._timer is None:
            when = heap[0][0]
            self._timer_at = when
            self._timer = loop.call_at(when, self._fire)
