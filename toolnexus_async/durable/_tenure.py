"""``Tenure``: what one worker can prove it holds, and how it rides out a store outage.

Rules of this module:

- **A lease is proven by a renewal, not assumed.** A worker's lease in the store runs until
  ``alive_until``, which each renewal moves to the renewal's start plus the lease. The
  worker counts as proven only what a *committed* renewal wrote, less a margin for the
  clocks of other workers: while ``time.time() < proven_until`` no other worker can have
  claimed a run it holds (claims need ``alive_until < now``).
- **A lapse is an epoch.** A renewal that commits after the proof ran out (the store was
  down, the event loop stalled) bumps ``epoch``: in the gap another worker may have claimed
  any of this worker's runs, so each run checks in the store that it is still held here
  before it starts another tool call (``RunJournal.fence``).
- **Recovering is gentle.** After a failure of the store, a worker renews promptly (backoff
  capped at ``retry_cap``), and claims no run held by another worker until ``grace`` has
  passed since its own first renewal that succeeded: every other live worker, retrying as
  promptly, has renewed by then, so only the runs of workers really gone are taken.
- **Retries queue.** At most a couple of retried writes are in flight at once, however
  many runs wait: the rest of the pool stays free for new calls, which fail fast (503)
  instead of queueing behind retries for the store timeout.
- **One line per outage**, for the whole process: the first failure is logged as a
  warning, the recovery as one line with how long the outage lasted; nothing per retried
  call. ``serve`` reports what its requests and its probe see into the host's tenure
  (``DurableHost.store_health``), not into a log of its own.
"""

from __future__ import annotations

import logging
import time

import anyio

__all__ = ("Backoff", "Tenure")

log = logging.getLogger("toolnexus_async.durable")

_RETRIES_AT_ONCE = 2


class Backoff:
    """Delays between retries: ``first``, doubling, at most ``cap`` seconds."""

    __slots__ = ("_cap", "_next")

    def __init__(self, cap: float, first: float = 0.05) -> None:
        self._cap = cap
        self._next = min(first, cap)

    def next(self) -> float:
        delay = self._next
        self._next = min(delay * 2, self._cap)
        return delay


class Tenure:
    """One worker's proof of its lease, renewal by renewal (see the module rules)."""

    __slots__ = (
        "_down_since",
        "_lease",
        "_margin",
        "_renewed",
        "_up_since",
        "epoch",
        "grace",
        "proven_until",
        "retries",
        "retry_cap",
        "worker",
    )

    def __init__(self, worker: str, lease: float) -> None:
        self.worker = worker
        self._lease = lease
        # Other workers' clocks may run ahead of ours: the proof ends a little early.
        self._margin = min(lease / 6, 5.0)
        self.retry_cap = min(1.0, lease / 6)
        self.grace = lease / 3 + 2 * self.retry_cap
        self.proven_until: float | None = None  # None: never renewed yet
        self.epoch = 0
        self._renewed = anyio.Event()
        self._down_since: float | None = None
        self._up_since = float("-inf")  # no outage seen yet: nothing to wait for
        # Retried writes in flight at once: while the store is down or locked, each
        # retry may hold a pooled connection for the whole store timeout; a few at a time
        # find out as well as all at once, and leave connections to everyone else.
        self.retries = anyio.Semaphore(_RETRIES_AT_ONCE)

    def proven(self, now: float) -> bool:
        return self.proven_until is not None and now < self.proven_until

    def renewed(self, started: float) -> None:
        """A renewal that began at ``started`` (``time.time()``) committed."""
        now = time.time()
        if self.proven_until is not None and now >= self.proven_until:
            self.epoch += 1
            log.warning(
                "worker %s: its lease lapsed before this renewal; each of its runs checks "
                "that it still holds it before its next tool call",
                self.worker,
            )
        self.proven_until = max(self.proven_until or 0.0, started + self._lease - self._margin)
        self.store_up()
        renewed, self._renewed = self._renewed, anyio.Event()
        renewed.set()

    async def wait_renewed(self) -> None:
        await self._renewed.wait()

    # -- the store's health, as this worker sees it -----------------------------------------

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def store_down(self, error: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "worker %s: the run store is unavailable (%s); runs wait, and what needs "
                "the store is refused, until it is back",
                self.worker,
                error,
            )

    def store_up(self) -> None:
        if self._down_since is not None:
            now = time.monotonic()
            log.warning(
                "worker %s: the run store is back after %.1f s", self.worker, now - self._down_since
            )
            self._down_since = None
            self._up_since = now

    def may_take_over(self) -> bool:
        """Whether runs held by other workers (whose lease ran out) may be claimed now."""
        return not self.down and time.monotonic() - self._up_since >= self.grace
