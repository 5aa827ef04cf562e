"""The event bus behind ``GET /events``: every subscriber sees every event, none slows a run.

Rules of this module:

- Publishing never awaits and never raises: a run hands its event to each subscriber's
  bounded buffer and goes on. A subscriber whose buffer is full is dropped on the spot and
  its connection is aborted, so a client that stops reading costs one buffer, never a
  stalled run. Text that UTF-8 cannot encode (a lone surrogate) is sent as a JSON ``\\u``
  escape; an event that is not JSON at all is logged and skipped. So a run's task never
  fails, and is never left ``running``, because of what it reported.
- An event is encoded once, as the bytes of one server-sent event, whatever the number of
  subscribers.
- A subscription ends one of three ways: its client leaves, it is dropped for falling
  behind, or the bus closes (server shutdown). Closing ends idle streams cleanly and aborts
  only those stuck writing to a client that does not read.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from aiohttp import web

__all__ = ("KEEPALIVE_SECONDS", "SUBSCRIBER_BUFFER", "EventBus", "format_event", "stream_events")

log = logging.getLogger("toolnexus_async.serve")

# A comment line this often keeps proxies and browsers from timing an idle stream out.
KEEPALIVE_SECONDS = 15.0
# Events buffered per subscriber before it counts as too slow and is dropped.
SUBSCRIBER_BUFFER = 1024

_KEEPALIVE = b": keep-alive\n\n"
# Written at once, so the response headers reach the client before the first event does.
_HELLO = b": connected\n\n"


def format_event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: ``event: <name>``, one ``data:`` line of JSON, a blank line.

    Raises ``TypeError`` or ``ValueError`` for data that is not JSON.
    """
    # json.dumps never emits a raw newline, so the data always fits on one line.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        return f"event: {name}\ndata: {payload}\n\n".encode()
    except UnicodeEncodeError:  # a lone surrogate: as an ASCII escape it is valid JSON
        payload = json.dumps(data, separators=(",", ":"))
        return f"event: {name}\ndata: {payload}\n\n".encode()


class Subscription:
    """One client of ``GET /events``: a bounded buffer and the scope its writes run in."""

    def __init__(self, buffer: int) -> None:
        self._send, self.receive = anyio.create_memory_object_stream[bytes](buffer)
        self.scope = anyio.CancelScope()
        self.writing = False  # awaiting a write to the client (which may never finish)
        self.dropped = False

    def offer(self, chunk: bytes) -> bool:
        """Buffer ``chunk``; False when the buffer is full or the client has gone."""
        try:
            self._send.send_nowait(chunk)
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    def end(self) -> None:
        """No more events: the stream ends once the buffered ones are written."""
        self._send.close()

    def drop(self) -> None:
        """Stop now: the pending write is cancelled and the connection aborted."""
        self.dropped = True
        self._send.close()
        self.scope.cancel()


class EventBus:
    """Fans events out to the current subscribers of ``GET /events``."""

    def __init__(self, buffer: int | None = None) -> None:
        self._buffer = SUBSCRIBER_BUFFER if buffer is None else buffer
        self._subscribers: set[Subscription] = set()
        self._closed = False
        self.dropped = 0  # subscribers dropped for falling behind, since the start

    def __len__(self) -> int:
        return len(self._subscribers)

    @property
    def closed(self) -> bool:
        return self._closed

    def subscribe(self) -> Subscription:
        sub = Subscription(self._buffer)
        if self._closed:
            sub.end()
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)
        sub.end()

    def publish(self, name: str, data: dict[str, Any]) -> None:
        """Send one event to every subscriber; drop those that cannot take it now.

        Never raises: an event that cannot be encoded is logged and skipped.
        """
        if not self._subscribers:
            return
        try:
            chunk = format_event(name, data)
        except Exception:  # not JSON (RecursionError included): the run must go on
            log.exception("skipped a %r event that cannot be encoded", name)
            return
        for sub in tuple(self._subscribers):
            if not sub.offer(chunk):
                self._subscribers.discard(sub)
                self.dropped += 1
                log.warning("dropped an event-stream client that fell behind")
                sub.drop()

    def close(self) -> None:
        """End every stream (idempotent); later subscribers get an empty stream."""
        self._closed = True
        subscribers, self._subscribers = self._subscribers, set()
        for sub in subscribers:
            if sub.writing:
                sub.drop()  # stuck on a client that does not read: do not wait for it
            else:
                sub.end()


async def stream_events(request: web.Request, bus: EventBus) -> web.StreamResponse:
    """Serve ``GET /events`` until the client leaves, falls behind or the server stops."""
    sub = bus.subscribe()
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # tell nginx-style proxies not to buffer the stream
        }
    )
    try:
        await response.prepare(request)
        with sub.scope:
            await _write(sub, response, _HELLO)
            await _pump(sub, response)
    except ConnectionError:
        return response  # the client left; aiohttp finishes the response quietly
    finally:
        bus.unsubscribe(sub)
        sub.receive.close()
    if sub.dropped:
        # A write may have been cut mid-chunk: the only safe end is to drop the connection.
        transport = request.transport
        if transport is not None:
            transport.abort()
    return response


async def _pump(sub: Subscription, response: web.StreamResponse) -> None:
    keepalive = KEEPALIVE_SECONDS
    while True:
        chunk = _KEEPALIVE
        with anyio.move_on_after(keepalive):
            try:
                chunk = await sub.receive.receive()
            except anyio.EndOfStream:
                return
        await _write(sub, response, chunk)


async def _write(sub: Subscription, response: web.StreamResponse, chunk: bytes) -> None:
    sub.writing = True
    try:
        await response.write(chunk)
    finally:
        sub.writing = False
