"""The SQLite store's group commit: its queue of writes, their deadlines, its committer.

Rules of this module:

- **Group commit.** Every write is queued; the committer task (started by the first
  write to find none running, ended when the queue is empty) commits the queue in one
  ``BEGIN IMMEDIATE`` transaction (``_batch.apply``), then the writes queued meanwhile in
  the next one, at most ``batch_max`` writes per transaction, in the order they were
  queued. Under load many suspensions and answers share one commit; alone, a write waits
  for nothing. A refused write changes nothing (``_ops`` checks before it writes), so it
  does not undo the others. A write's caller resumes only after its transaction
  committed (told by ``_batch.Teller``).
- No caller commits: a queued write commits with its batch even if its caller is
  cancelled meanwhile (an anyio scope, ``asyncio.timeout``), so no caller's cancellation
  can leave a batch half done or strand the writes queued behind it.
- Each write is due ``timeout`` seconds after it was queued: one still queued past that
  is failed with :class:`StoreUnavailableError` and never tried (so known not to be
  committed), and a batch waits for another process's lock no longer than its earliest
  write has left.
- Every write of a batch that failed is failed with it (``sqlite3`` errors mapped by the
  store's function), none is retried here: the committer goes on with the next batch.
  The committer itself stopped (the event loop closing): each write it had not told is
  told it may or may not be committed.
- The batch runs through the store's function that runs a job on its connection, in its
  worker thread; this module owns no connection and never opens one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ..._core.errors import StoreError, StoreUnavailableError
from .._due import in_time
from ._batch import Queued, Teller, apply

__all__ = ("GroupCommit",)

T = TypeVar("T")

Run = Callable[[Callable[[sqlite3.Connection], list[Any]]], Awaitable[list[Any]]]


class GroupCommit:
    """The queue of a store's writes and the task that commits it, batch after batch.

    Args:
        run: runs a job on the store's connection, in its worker thread.
        error: the :class:`StoreError` a ``sqlite3`` error of a write becomes.
        name: the store, as writes' errors name it (its label and file).
        task_name: the committer task's name.
        timeout: seconds a write may wait, queued and committing, before it is failed.
        keep: how many ended runs are kept (``_batch.apply``).
        committed: called on the event loop after each batch committed (it must not block).
    """

    # The most writes one transaction takes. Telling a batch's callers, and building its
    # outcomes, costs the loop time in proportion to the batch in one go: unbounded, a
    # burst of 100,000 answers queued behind one commit became one batch, and the loop
    # stopped for 50 to 100 ms to take in its outcomes. Bounded, that step stays a few
    # milliseconds, the next batch's commit starts while the callers of this one go on, and
    # the first writes of a burst are told after one bounded commit, not after the whole
    # burst's. (Parking 10,000 runs at once was as fast with 4,096 as without a bound,
    # within the noise; 256 was slower.)
    batch_max = 4096

    def __init__(
        self,
        run: Run,
        error: Callable[[sqlite3.Error], StoreError],
        *,
        name: str,
        task_name: str,
        timeout: float,
        keep: int,
        committed: Callable[[], None] | None = None,
    ) -> None:
        self._run = run
        self._on_commit = committed
        self._error = error
        self._name = name
        self._task_name = task_name
        self._timeout = timeout
        self._keep = keep
        self._queue: list[Queued] = []
        # When each queued write must be answered by (time.monotonic()), in queue order: a
        # write queued behind a batch held up by a lock gets the rest of its own timeout,
        # not a timeout of its own after that batch's.
        self._due: list[float] = []
        self._teller = Teller()
        self._committer: asyncio.Task[None] | None = None  # while the queue is not empty
        self._flushed = anyio.Event()  # set whenever no write is in flight
        self._flushed.set()

    def write(self, op: Callable[..., T | Exception], args: tuple[Any, ...]) -> Awaitable[T]:
        """Queue ``op(ops, *args)``; the future is done once the transaction it went into
        committed.

        The queue is committed by the committer task, never by a caller: a task that
        ``asyncio.timeout`` or ``wait_for`` cancels is cancelled natively, through any
        anyio shield, and a caller that committed would then strand the writes queued
        behind its own. A cancelled caller is told nothing more; its write commits with its
        batch all the same.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((op, args, future))
        self._due.append(time.monotonic() + self._timeout)
        if self._committer is None:
            self._flushed = anyio.Event()
            self._committer = loop.create_task(self._commit_queue(), name=self._task_name)
        return future

    async def flushed(self) -> None:
        """Wait until no write is in flight (the queue committed, or failed)."""
        await self._flushed.wait()

    async def _commit_queue(self) -> None:
        """Commit the queue, batch after batch, until it is empty (the committer task)."""
        try:
            while self._queue:
                most = self.batch_max
                batch, due = self._queue[:most], self._due[:most]
                del self._queue[:most], self._due[:most]
                live, budget = self._in_time(batch, due)
                if live:
                    await self._commit(live, budget)
        except BaseException as exc:
            # Cancelled itself: the event loop is closing. What is queued was not committed.
            left, self._queue, self._due = self._queue, [], []
            for _, _, future in left:
                if not future.done():
                    future.set_exception(self._interrupted(exc))
            raise
        finally:
            self._committer = None
            self._flushed.set()

    def _in_time(self, batch: list[Queued], due: list[float]) -> tuple[list[Queued], float]:
        """The writes of ``batch`` still in time, and the seconds left to the earliest of
        them; the others are failed, never tried (so known not to be committed)."""
        return in_time(
            batch,
            due,
            lambda item: item[2],
            lambda: StoreUnavailableError(
                f"{self._name}: this write waited {self._timeout:g} s"
                " behind writes held up (the file locked by another process, a"
                " slow disk); it was not committed"
            ),
        )

    def _interrupted(self, cause: BaseException) -> StoreError:
        """What a writer is told when the committer itself was stopped (the event loop is
        closing): a batch in the worker thread may commit all the same, the rest did not."""
        return StoreError(
            f"{self._name}: the commit was interrupted ({type(cause).__name__});"
            " this write may or may not be committed"
        )

    async def _commit(self, batch: list[Queued], budget: float) -> None:
        keep = self._keep
        try:
            outcomes = await self._run(lambda conn: self._apply(conn, batch, keep, budget))
        except BaseException as exc:
            failure: BaseException = exc
            if isinstance(exc, sqlite3.Error):
                failure = self._error(exc)
            elif not isinstance(exc, Exception):
                failure = self._interrupted(exc)
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        self._teller.add(batch, outcomes)
        if self._on_commit is not None:
            self._on_commit()

    def _apply(
        self, conn: sqlite3.Connection, batch: list[Queued], keep: int, budget: float
    ) -> list[Any]:
        """``apply`` (in the worker thread), waiting for another process's lock no longer
        than the batch's earliest write has left (only set when that is less than the
        timeout the connection has: it is one more statement)."""
        if budget >= 0.9 * self._timeout:
            return apply(conn, batch, keep)
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(budget * 1000))}")
        try:
            return apply(conn, batch, keep)
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
