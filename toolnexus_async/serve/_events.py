"""The event bus behind ``GET /events``: every subscriber sees every event, none slows a run.

Rules of this module:

- The events are the store's (``_feed`` reads them, in commit order, and publishes them
  here): each carries its store ``seq`` as its SSE ``id``, the same on every worker. A
  client that reconnects with ``Last-Event-ID`` is first sent what it missed, read back
  from the store, then the live events; one whose id is too old (pruned, or more than the
  feed replays) is sent a ``snapshot`` event instead, telling it to fetch the lists again.
  A subscriber never gets an event at or below the id it resumed from, so a worker that is
  behind the one the client came from sends nothing twice.

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
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from aiohttp import web

__all__ = ("KEEPALIVE_SECONDS", "SUBSCRIBER_BUFFER", "EventBus", "format_event", "stream_events")

# Replays (the events a reconnecting client missed), awaited by the stream before it goes
# live: ``(after, upto)`` -> the events' bytes, or None when ``after`` is too old.
Replay = Callable[[int, int], Awaitable[list[bytes] | None]]

log = logging.getLogger("toolnexus_async.serve")

# A comment line this often keeps proxies and browsers from timing an idle stream out.
KEEPALIVE_SECONDS = 15.0
# Events buffered per subscriber before it counts as too slow and is dropped.
SUBSCRIBER_BUFFER = 1024

_KEEPALIVE = b": keep-alive\n\n"
# Written at once, so the response headers reach the client before the first event does.
_HELLO = b": connected\n\n"


def format_event(name: str, data: dict[str, Any] | str, seq: int | None = None) -> bytes:
    """One server-sent event: ``id: <seq>`` (if given), ``event: <name>``, one ``data:``
    line of JSON (``data`` as a value, or as JSON text already), a blank line.

    Raises ``TypeError`` or ``ValueError`` for data that is not JSON.
    """
    head = f"event: {name}\n" if seq is None else f"id: {seq}\nevent: {name}\n"
    if isinstance(data, str):  # the store's JSON, one line and ASCII: sent as it is
        return f"{head}data: {data}\n\n".encode()
    # json.dumps never emits a raw newline, so the data always fits on one line.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        return f"{head}data: {payload}\n\n".encode()
    except UnicodeEncodeError:  # a lone surrogate: as an ASCII escape it is valid JSON
        payload = json.dumps(data, separators=(",", ":"))
        return f"{head}data: {payload}\n\n".encode()


class Subscription:
    """One client of ``GET /events``: a bounded buffer and the scope its writes run in."""

    def __init__(self, buffer: int, after: int = 0) -> None:
        self._send, self.receive = anyio.create_memory_object_stream[bytes](buffer)
        self.after = after  # events up to this seq are not sent (the client has them)
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
    def buffer(self) -> int:
        """Events buffered per subscriber before it counts as too slow."""
        return self._buffer

    @property
    def closed(self) -> bool:
        return self._closed

    def subscribe(self, after: int = 0) -> Subscription:
        sub = Subscription(self._buffer, after)
        if self._closed:
            sub.end()
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)
        sub.end()

    def publish(self, name: str, data: dict[str, Any] | str, seq: int = 0) -> None:
        """Send one event to every subscriber; drop those that cannot take it now.

        Never raises: an event that cannot be encoded is logged and skipped.
        """
        if not self._subscribers:
            return
        try:
            chunk = format_event(name, data, seq or None)
        except Exception:  # not JSON (RecursionError included): the stream must go on
            log.exception("skipped a %r event that cannot be encoded", name)
            return
        for sub in tuple(self._subscribers):
            if seq and seq <= sub.after:
                continue  # the client had it before it came here
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


def resumed_from(request: web.Request) -> int | None:
    """The client's ``Last-Event-ID``: a seq, -1 if it is not one of ours, None if none."""
    given = request.headers.get("Last-Event-ID")
    if given is None or not given.strip():
        return None
    try:
        seq = int(given.strip())
    except ValueError:
        return -1
    return seq if seq >= 0 else -1


async def stream_events(
    request: web.Request, bus: EventBus, cursor: int, replay: Replay
) -> web.StreamResponse:
    """Serve ``GET /events`` until the client leaves, falls behind or the server stops.

    ``cursor``: the seq of the last event published on ``bus`` (read with no await before
    the subscription, so that what follows it is live); ``replay`` reads what a client
    resuming from an older id missed.
    """
    last = resumed_from(request)
    sub = bus.subscribe(after=cursor if last is None or last < 0 else last)
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
            if last is not None and last != cursor:
                missed = await replay(last, cursor) if last >= 0 else None
                if missed is None:  # not ours, pruned, or too many: start afresh
                    sub.after = cursor
                    missed = [format_event("snapshot", {"id": cursor}, cursor)]
                for chunk in missed:
                    await _write(sub, response, chunk)
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
