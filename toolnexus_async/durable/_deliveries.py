"""Answers for runs parked here: handed to the inbox they park in.

Rules of this module:

- An answer is marked delivered only once the inbox took it, whoever took the answer. Until
  then the store keeps it undelivered, so that a run that halts or dies without it is
  resumed with it (the sweep), and one that parks here again is handed it (below).
- An answer this worker takes (:meth:`Deliveries.take`, for ``DurableHost.answer``) is
  committed first, then handed to its run if that run is parked here *and* the store says
  this worker holds it: a host whose lease ran out must not wake its stale copy of a run
  that another worker now drives.
- Answers another worker took are asked for (``deliveries``) as soon as the store tells of
  one (:meth:`RunStore.listen`: an ``answered`` event for a run this worker holds), and
  every ``poll`` seconds regardless, so an event that was missed (a dropped LISTEN
  connection, a store that cannot tell, a caller cancelled before its commit told anyone)
  delays a wake-up by ``poll`` at the most and never loses it. An answer for a request not
  parked here (yet) is left for the next look.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from .._core.errors import AnswerError, StoreUnavailableError, UsageError
from .._core.types import Answer
from ..suspend import Inbox
from ._store import Accepted, RunStore, StoreEvent

__all__ = ("Deliveries",)

log = logging.getLogger("toolnexus_async.durable")


class Deliveries:
    """Hands ``worker``'s answers to ``inbox``, and marks them delivered in ``store``."""

    def __init__(
        self,
        store: RunStore,
        worker: str,
        inbox: Inbox,
        poll: float,
        on_fault: Callable[[StoreUnavailableError], None] | None = None,
    ) -> None:
        self._store = store
        self._on_fault = on_fault
        self._worker = worker
        self._inbox = inbox
        self._poll = poll
        self._wake = anyio.Event()
        # Answers this worker takes itself, from before their commit until they are marked
        # delivered: their events are no reason to look.
        self._own: set[str] = set()
        # Handed over by take(); marked delivered at the next look, in one write.
        self._handed: list[str] = []

    def told(self, event: StoreEvent) -> None:
        """A :meth:`RunStore.listen` callback: look now if the event is for us."""
        if (
            event.kind == "answered"
            and event.owner == self._worker
            and not event.delivered
            and event.request_id not in self._own
        ):
            self._wake.set()

    async def take(self, answer: Answer) -> Accepted:
        """Commit ``answer`` as the one answer of its request, then hand it to its run if
        this worker holds the run and it is parked here.

        Raises what :meth:`RunStore.accept` raises; then nothing was taken.
        """
        request_id = answer.id
        own = self._own
        own.add(request_id)
        try:
            accepted = await self._store.accept(answer, time.time(), by=self._worker)
        except AnswerError:
            own.discard(request_id)
            raise
        except BaseException:
            # Cancelled (or failed) while committing: the write may commit all the same,
            # and then nobody is told; look for it now and at every poll.
            own.discard(request_id)
            self._wake.set()
            raise
        mine = accepted.owner == self._worker
        if mine and self._hand(answer):
            self._handed.append(request_id)
        else:
            own.discard(request_id)
            if mine:
                self._wake.set()  # not parked here right now: looked for again
        return accepted

    def _hand(self, answer: Answer) -> bool:
        """Whether the run parked here on ``answer.id`` took it."""
        if self._inbox.get(answer.id) is None:
            return False
        try:
            self._inbox.answer_nowait(answer)
        except AnswerError:  # it left meanwhile (halted, expired)
            return False
        return True

    async def run(self) -> None:
        """Look when told, and every ``poll`` seconds; until cancelled."""
        while True:
            self._wake = anyio.Event()
            try:
                await self.deliver()
            except StoreUnavailableError as exc:
                if self._on_fault is None:
                    raise
                self._on_fault(exc)  # the host's one line per outage
            except Exception:
                log.exception(
                    "durable host %s: handing answers over failed; retrying", self._worker
                )
            with anyio.move_on_after(self._poll):
                await self._wake.wait()

    async def deliver(self) -> None:
        """Hand over what the store has for runs parked here, once, and mark what was
        handed over (here or by :meth:`take`) delivered."""
        taken = self._handed
        self._handed = []
        handed = list(taken)
        try:
            for _run_id, answer in await self._store.deliveries(self._worker):
                if answer.id in self._own:
                    continue  # take() has it
                if self._inbox.get(answer.id) is None:
                    continue  # not parked (yet): next time
                try:
                    await self._inbox.answer(answer)
                except UsageError:
                    continue
                except Exception:  # answered or expired here meanwhile: nothing to hand over
                    pass
                handed.append(answer.id)
            if handed:
                await self._store.delivered(handed)
        except BaseException:
            self._handed.extend(taken)  # marked at the next look
            raise
        self._own.difference_update(taken)
