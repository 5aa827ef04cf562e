"""Who hears of the requests an :class:`~toolnexus_async.suspend.Inbox` parks: the
iterators of ``Inbox.requests()``.

Rules of this module:

- Each listener gets every request parked after it began listening, once, in the order
  they were parked; requests parked before are the inbox's ``pending()``.
- Telling the listeners never waits and never fails a park: what a listener has not
  taken yet is buffered (without bound, as the parked runs themselves are).
- A listener whose iterator is closed (or finalized) is forgotten.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from .._core.types import Request

__all__ = ("Listeners",)


class Listeners:
    """The listeners of one inbox."""

    __slots__ = ("listening",)

    def __init__(self) -> None:
        # Read by the inbox before it tells anyone: empty, a park pays nothing more.
        self.listening: set[MemoryObjectSendStream[Request]] = set()

    def tell(self, request: Request) -> None:
        """Hand ``request`` to every listener."""
        for listener in tuple(self.listening):
            try:
                listener.send_nowait(request)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.listening.discard(listener)

    async def requests(self) -> AsyncGenerator[Request, None]:
        """Each request told from now on, once, as it arrives."""
        send, receive = anyio.create_memory_object_stream[Request](math.inf)
        self.listening.add(send)
        try:
            async with receive:
                while True:
                    # What is buffered already is handed on without a trip through the
                    # event loop each (anyio's receive() is a checkpoint even then): the
                    # loop is entered once per burst of parks, not once per park.
                    try:
                        request = receive.receive_nowait()
                    except anyio.WouldBlock:
                        try:
                            request = await receive.receive()
                        except anyio.EndOfStream:
                            return
                    yield request
        finally:
            self.listening.discard(send)
            send.close()
