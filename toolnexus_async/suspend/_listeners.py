"""Who hears of the requests an :class:`~toolnexus_async.suspend.Inbox` parks: the
iterators of ``Inbox.requests()``.

Rules of this module:

- Each listener gets every request parked after it began listening, once, in the order
  they were parked; requests parked before are the inbox's ``pending()``.
- Telling the listeners never waits and never fails a park: what a listener has not
  taken yet is buffered (without bound, as the parked runs themselves are).
- What is buffered is handed on without a trip through the event loop each: a listener
  waits (one future) only when it has taken everything, so a burst of parks costs it one
  step of the loop, not one per park.
- A listener whose iterator is closed, cancelled or finalized is forgotten.
- A listener is a deque and the future it waits on, not an anyio memory stream: telling
  one is an append (issue 41, fifth pass on the engine side in ``docs/performance.md``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator

from .._core.types import Request

__all__ = ("Listeners",)


class _Listener:
    """One iterator's buffer, and the future it waits on while the buffer is empty."""

    __slots__ = ("buffer", "waiting")

    def __init__(self) -> None:
        self.buffer: deque[Request] = deque()
        self.waiting: asyncio.Future[None] | None = None


class Listeners:
    """The listeners of one inbox."""

    __slots__ = ("listening",)

    def __init__(self) -> None:
        # Read by the inbox before it tells anyone: empty, a park pays nothing more.
        self.listening: set[_Listener] = set()

    def tell(self, request: Request) -> None:
        """Hand ``request`` to every listener (no code of theirs runs here)."""
        for listener in self.listening:
            listener.buffer.append(request)
            waiting = listener.waiting
            if waiting is not None:
                listener.waiting = None
                if not waiting.done():  # a cancelled wait is its iterator's to end
                    waiting.set_result(None)

    async def requests(self) -> AsyncGenerator[Request, None]:
        """Each request told from now on, once, as it arrives."""
        listener = _Listener()
        self.listening.add(listener)
        buffer = listener.buffer
        try:
            while True:
                while buffer:
                    yield buffer.popleft()
                waiting = listener.waiting = asyncio.get_running_loop().create_future()
                await waiting
        finally:
            self.listening.discard(listener)
