"""Every run's events, from the store, on this worker's event stream.

Rules of this module:

- **Nothing is announced before it is committed.** The events are rows the store wrote
  in the transactions that committed what they tell (``durable._run_events``); the feed
  reads them back in commit order (``EventTail``) and publishes each once, with its
  ``seq`` as its id. So every worker's stream carries every run's events, in order per
  run, whichever worker drove the run, and a client reconnecting anywhere resumes by id.
- The feed reads when a write of this process committed or another worker's was told
  (``RunStore.watch``), and every :data:`POLL` seconds regardless (another worker's steps
  that were not told, a missed notification); never more often than every :data:`PAUSE`
  seconds, so that under load its reads do not crowd the store's writes. A write pays one
  row of its own transaction per event; telling other workers costs nothing more.
- A read that fails (the store is down) is tried again at the next look; the outage is
  reported elsewhere (``_outage``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio

from .._core.errors import StoreError
from .._core.types import Request
from ..durable import RunStore
from ..durable._run_events import EventTail, StoredEvent
from ._events import EventBus, format_event
from ._runs import shown

__all__ = ("EventFeed",)

log = logging.getLogger("toolnexus_async.serve")

# Seconds between two looks at the store when nothing woke the feed.
POLL = 0.25
# The shortest time between two reads of the feed, in seconds.
PAUSE = 0.02
# Events read at once.
BATCH = 500
# The most events a reconnecting client is sent back; an older id gets a snapshot.
REPLAY_MAX = 10_000
# At start, how far back the feed begins (events in flight then are not skipped).
LOOKBACK = 1_000


class EventFeed:
    """Reads ``store``'s events and publishes them on ``bus``."""

    def __init__(self, store: RunStore, bus: EventBus) -> None:
        self._store = store
        self._bus = bus
        self._tail = EventTail(0)
        self._wake = anyio.Event()
        self._unwatch: Callable[[], None] = lambda: None

    @property
    def cursor(self) -> int:
        """The seq of the last event published (every earlier one was, or never will be)."""
        return self._tail.after

    async def open(self) -> None:
        """Start from the store's newest events, caught up before the server serves."""
        _, newest = await self._store.event_bounds()
        self._tail = EventTail(max(0, newest - LOOKBACK))
        self._unwatch = self._store.watch(self._wake.set)
        await self._drain()

    def close(self) -> None:
        self._unwatch()

    async def run(self) -> None:
        """Follow the store until cancelled."""
        while True:
            with anyio.move_on_after(POLL):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self._drain()
            except StoreError as exc:
                log.debug("the event feed could not read the store: %s", exc)
            await anyio.sleep(PAUSE)

    async def _drain(self) -> None:
        # At most half a subscriber's buffer at once, then a pause: a client that reads
        # keeps up with any burst, and only one that stopped reading is dropped.
        batch = max(1, min(BATCH, self._bus.buffer // 2))
        while True:
            read = await self._store.events(self._tail.after, batch)
            for event in self._tail.take(read):
                self._publish(event)
            if len(read.events) < batch or self._tail.after < read.events[-1].seq:
                return  # all read, or waiting for a transaction still in progress
            await anyio.sleep(PAUSE)

    def _publish(self, event: StoredEvent) -> None:
        if not len(self._bus):
            return  # nobody listens: nothing to encode
        self._bus.publish(event.kind, _data(event), event.seq)

    async def replay(self, after: int, upto: int) -> list[bytes] | None:
        """The events after ``after`` through ``upto``, as sent; None when ``after`` is
        too old (pruned, or more than :data:`REPLAY_MAX` back) or not of this store."""
        oldest, newest = await self._store.event_bounds()
        if after > newest or upto - after > REPLAY_MAX or (after + 1 < oldest and after < upto):
            return None
        chunks: list[bytes] = []
        while after < upto:
            read = await self._store.events(after, BATCH)
            if not read.events:
                break
            for event in read.events:
                if event.seq > upto:
                    return chunks
                chunks.append(format_event(event.kind, _data(event), event.seq))
            after = read.events[-1].seq
        return chunks


def _data(event: StoredEvent) -> str | dict[str, object]:
    """What a client is sent: the stored JSON, but a request with its ``display`` added."""
    if event.kind != "pending":
        return event.data
    data = json.loads(event.data)
    data["request"] = shown(Request.from_dict(data["request"]))
    return dict(data)
