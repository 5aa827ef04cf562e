"""The durable host's background upkeep: leases renewed, runs swept up, runs let go.

Rules of this module:

- **A lease is renewed in the background**, every third of its length, for every run this
  worker holds (one write per worker, not per run). After a failure it is retried soon
  (backoff), so that the lease outlives a short outage and is proven again as soon as the
  store is back.
- **The sweep takes over what nobody drives**: every ``sweep`` seconds it claims the runs the
  store says can go on (a dead worker's, whose lease ran out; one whose request expired
  while nobody held it), at most ``_SWEEP_BATCH`` a look, and hands each to the host to
  adopt. Just after an outage it takes over nothing until the live workers have renewed
  (:meth:`Tenure.may_take_over`): every lease has run out then, the live ones' too.
- **The store's faults are waited out, never recorded**: a background job that meets
  ``StoreUnavailableError`` tells the tenure (one line per outage) and tries again at its
  next look.
- **A run given up here is never left held here and not driven**: its release
  (:meth:`Upkeep.release`, one try) or its failure (:meth:`Upkeep.record_failure`, bounded
  by the tenure's grace) is tried at once; what the store did not take (a release: ``None``;
  a failure: its message) is kept in :attr:`Upkeep.letting_go` and retried every ``sweep``
  seconds until the store takes it, or says another worker holds it or it was never kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._core.errors import DamagedRunError, StoreError, StoreUnavailableError, UnknownRequestError
from .._core.loop import RunLoop
from ._deliveries import Deliveries
from ._journal import RunJournal
from ._store import LeaseLostError, RunStore, StoredRun
from ._tenure import Backoff, Tenure

__all__ = ("Upkeep",)

log = logging.getLogger("toolnexus_async.durable")

# Stored runs claimed per sweep; the rest wait for the next sweep.
_SWEEP_BATCH = 100


class Upkeep:
    """Renews ``worker``'s leases in ``store``, sweeps for runs to ``claim`` and ``adopt``,
    lets go of the runs given up here, and runs ``deliveries``: until cancelled."""

    def __init__(
        self,
        store: RunStore,
        worker: str,
        tenure: Tenure,
        *,
        lease: float,
        sweep: float,
        claim: Callable[[str, float], Awaitable[StoredRun | None]],
        adopt: Callable[[StoredRun], Awaitable[None]],
        closing: Callable[[], bool],
        deliveries: Deliveries | None = None,
    ) -> None:
        self.store = store
        self.worker = worker
        self._tenure = tenure
        self._lease = lease
        self._sweep = sweep
        self._claim = claim
        self._adopt = adopt
        self._closing = closing
        self._deliveries = deliveries
        # Runs this host gave up driving whose release (None) or failure (its message) the
        # store has not taken yet: retried in the background, so none stays held here.
        self.letting_go: dict[str, str | None] = {}

    def give_up(self, run_id: str, error: str | None = None) -> None:
        """Release ``run_id`` (``error`` None), or record it failed with ``error``, in the
        background, as soon as the store takes it."""
        self.letting_go[run_id] = error

    async def record_failure(
        self, loop: RunLoop, journal: RunJournal, exc: BaseException | None
    ) -> None:
        """Record what the run itself did wrong; under a shield, so bounded: a store that
        does not take it soon gets it from the background (:meth:`give_up`)."""
        message = "cancelled" if exc is None else f"{type(exc).__name__}: {exc}"
        with anyio.move_on_after(self._tenure.grace):
            try:
                await journal.failed(loop, message)
            except LeaseLostError:
                pass
            except Exception:
                log.exception("run %s failed and its failure could not be recorded", loop.run_id)
            else:
                return
        if journal.written:
            self.give_up(loop.run_id, message)

    async def release(self, journal: RunJournal) -> None:
        """Let the next host go on with the run; one try (the host is closing), and the
        background tries again while the host lives (its lease ends with it anyway)."""
        try:
            await journal.release()
        except StoreError as exc:
            log.warning("run %s could not be let go now: %s", journal.run_id, exc)
            self.give_up(journal.run_id)

    async def run(self, scope: anyio.CancelScope) -> None:
        """Renew leases, sweep for runs that can go on, hand over answers: until ``scope``
        is cancelled."""
        with scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._renewing)
                tg.start_soon(self._every, self._sweep, self._sweep_once)
                tg.start_soon(self._every, self._sweep, self._let_go)
                if self._deliveries is not None:
                    tg.start_soon(self._deliveries.run)

    async def _every(self, seconds: float, job: Callable[[], Any]) -> None:
        while True:
            try:
                await job()
            except StoreUnavailableError as exc:
                self._tenure.store_down(exc)  # one line per outage, not one per look
            except Exception:
                log.exception("durable host %s: background job failed; retrying", self.worker)
            await anyio.sleep(seconds)

    async def _renewing(self) -> None:
        """Renew every third of the lease; after a failure, again soon (backoff), so that
        the lease outlives a short outage and is proven again as soon as the store is back."""
        backoff: Backoff | None = None
        while True:
            try:
                await self._renew()
            except StoreUnavailableError as exc:
                self._tenure.store_down(exc)
            except Exception:
                log.exception("durable host %s: renewing its lease failed", self.worker)
            else:
                backoff = None
                await anyio.sleep(self._lease / 3)
                continue
            backoff = backoff or Backoff(self._tenure.retry_cap)
            await anyio.sleep(backoff.next())

    async def _renew(self) -> None:
        started = time.time()
        await self.store.renew(self.worker, started + self._lease)
        self._tenure.renewed(started)

    async def _sweep_once(self) -> None:
        if not self._tenure.may_take_over():
            # Just after an outage every lease in the store has run out, the live workers'
            # too: they renew within the grace, and only then is a stale lease a dead one.
            return
        now = time.time()
        for run_id in await self.store.ready(now, _SWEEP_BATCH):
            if self._closing():
                return
            try:
                stored = await self._claim(run_id, now)
            except DamagedRunError as exc:
                log.warning("durable host %s: %s", self.worker, exc)
                continue
            if stored is not None:
                await self._adopt(stored)

    async def _let_go(self) -> None:
        """Release, or record the failure of, each run given up here that the store did
        not take yet."""
        for run_id, error in list(self.letting_go.items()):
            try:
                if error is None:
                    await self.store.release(run_id, self.worker)
                else:
                    await self.store.fail(run_id, error, self.worker)
            except (LeaseLostError, UnknownRequestError):
                pass  # another worker holds it, or it was never kept: nothing to let go
            self.letting_go.pop(run_id, None)
