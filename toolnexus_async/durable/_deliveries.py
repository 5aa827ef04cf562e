"""Answers another worker accepted for runs parked here: handed to the inbox they park in.

Rules of this module:

- The store is asked for them (``deliveries``) as soon as it tells of one
  (:meth:`RunStore.listen`: an ``answered`` event for a run this worker holds, not handed
  over by the worker that took it), and every ``poll`` seconds regardless, so an event
  that was missed (a dropped LISTEN connection, a store that cannot tell) delays a wake-up
  by ``poll`` at the most and never loses it.
- An answer is marked delivered only once the inbox took it; an answer for a request not
  parked here (yet) is left for the next look.
"""

from __future__ import annotations

import logging

import anyio

from .._errors import UsageError
from ..suspend import Inbox
from ._store import RunStore, StoreEvent

__all__ = ("Deliveries",)

log = logging.getLogger("toolnexus_async.durable")


class Deliveries:
    """Hands ``worker``'s answers, taken by other workers, to ``inbox``."""

    def __init__(self, store: RunStore, worker: str, inbox: Inbox, poll: float) -> None:
        self._store = store
        self._worker = worker
        self._inbox = inbox
        self._poll = poll
        self._wake = anyio.Event()

    def told(self, event: StoreEvent) -> None:
        """A :meth:`RunStore.listen` callback: look now if the event is for us."""
        if event.kind == "answered" and event.owner == self._worker and not event.delivered:
            self._wake.set()

    async def run(self) -> None:
        """Look when told, and every ``poll`` seconds; until cancelled."""
        while True:
            self._wake = anyio.Event()
            try:
                await self.deliver()
            except Exception:
                log.exception(
                    "durable host %s: handing answers over failed; retrying", self._worker
                )
            with anyio.move_on_after(self._poll):
                await self._wake.wait()

    async def deliver(self) -> None:
        """Hand over what the store has for runs parked here, once."""
        handed: list[str] = []
        for _run_id, answer in await self._store.deliveries(self._worker):
            if self._inbox.get(answer.id) is None:
                continue  # not parked (yet): next time
            try:
                self._inbox.answer(answer)
            except UsageError:
                continue
            except Exception:  # answered or expired here meanwhile: nothing to hand over
                pass
            handed.append(answer.id)
        if handed:
            await self._store.delivered(handed)
