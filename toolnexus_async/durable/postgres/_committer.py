"""The PostgreSQL store's group commit: the writes of many runs in one transaction.

Rules of this module:

- **Group commit**, as the SQLite store's (``sqlite._committer``): every write is queued;
  a committer task (started by a write that finds the queue empty and a committer free,
  ended when the queue is empty) runs the queued writes in one transaction on one pooled
  connection, in the order they were queued, at most ``batch_max``, with the NOTIFYs of their events
  (:func:`notices`) in that same transaction, one statement; then the writes queued
  meanwhile. A write's caller resumes only after the transaction it went into
  committed: nothing is acknowledged before its commit, and nothing is announced before
  it either (PostgreSQL delivers a NOTIFY at its transaction's commit).
- At most :attr:`GroupCommit.parallel` (two) transactions in flight per queue, each on a
  connection of its own: a write that comes while one commits goes into the next at once,
  and the server flushes both with one WAL write; writes that come while both are in
  flight share the next. (PostgreSQL serialises the commits of transactions that notify,
  so more would mostly wait for each other.) Two batches in flight never hold two writes
  of one run (a run waits for each write), so the order between them is one their callers
  could have had.
- A refused write (a :class:`ToolnexusError` the operation raises or returns) changed
  nothing (``_ops`` checks in the statement that writes), so it does not undo the others.
  A statement that fails otherwise aborts the transaction: it is rolled back and each of
  its writes goes again in a transaction of its own, so that the failure is only its
  own. So does a batch PostgreSQL rolled back to break a deadlock with another worker's
  batch (:class:`ConflictError`: two batches may lock the same rows in two orders);
  alone, each is the one-write transaction the store always made. A lone write rolled
  back so (it can still be the victim of a cycle with other workers' batches) goes again,
  up to ``_CONFLICT_TRIES`` times, before its caller is told. A passing fault (the
  connection, the server stopping) fails every write of the batch with
  :class:`StoreUnavailableError`; none is retried here, and no caller was told its write
  committed.
- **Requests first**: before its writes, a batch locks the requests they will touch, in
  the one order every transaction of the store locks requests in (``first``, ``_order``),
  one statement and only when a write touches requests.
- **Alike writes go as one statement** (``_grouped``): every start of a batch, every
  turn, every suspension, result, end and answer taken, one statement per kind; a write
  it could not do (a refusal) goes alone after, in the same transaction.
- No caller commits: a queued write commits with its batch even if its caller is
  cancelled meanwhile, so no cancellation leaves a batch half done or strands the writes
  queued behind it.
- With ``call_timeout``, a write still queued that long after it came is failed, never
  tried (so known not to be committed).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio

from ..._core.errors import StoreError, StoreUnavailableError, ToolnexusError
from .._due import in_time
from .._store import StoreEvent
from ._errors import ConflictError
from ._grouped import AGAIN, Many
from ._ops import CHANNEL, LISTENING_LOCK, event_body
from ._order import First

__all__ = ("GroupCommit", "Notice", "notices")

# An event and the channels it goes to.
Notice = tuple[StoreEvent, tuple[str, ...]]
Tell = Callable[[Any], Iterable[Notice]]
Queued = tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], Tell | None, "asyncio.Future[Any]"]
# Runs ``body(conn)`` in a transaction on a pooled connection (``PgConnections``).
InTransaction = Callable[..., Awaitable[Any]]

After = Callable[[Any], Awaitable[None]]


async def _nothing_after(conn: Any) -> None:
    return None


# The notifications of a batch; those on CHANNEL only while a session listens there.
_NOTIFY = (
    "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS t(c, p)"
    f" WHERE c <> '{CHANNEL}' OR EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    f" AND classid = {LISTENING_LOCK >> 32} AND objid = {LISTENING_LOCK & 0xFFFFFFFF}"
    " AND objsubid = 1 AND granted)"
)
# A NOTIFY payload must stay under 8,000 bytes: a channel's events are sent in chunks.
_PAYLOAD_MAX = 7000


def notices(told: Iterable[Notice]) -> tuple[list[str], list[str]]:
    """The channels and payloads (a JSON list of events each, in order) of ``told``."""
    by_channel: dict[str, list[str]] = {}
    for event, channels in told:
        body = json.dumps(event_body(event))
        for channel in channels:
            by_channel.setdefault(channel, []).append(body)
    names: list[str] = []
    payloads: list[str] = []
    for channel, bodies in by_channel.items():
        chunk: list[str] = []
        size = 0
        for body in bodies:
            if chunk and size + len(body) + 1 > _PAYLOAD_MAX:
                names.append(channel)
                payloads.append("[" + ",".join(chunk) + "]")
                chunk, size = [], 0
            chunk.append(body)
            size += len(body) + 1
        names.append(channel)
        payloads.append("[" + ",".join(chunk) + "]")
    return names, payloads


class GroupCommit:
    """The queue of a store's writes and the task that commits it, batch after batch.

    Args:
        in_transaction: runs ``body(conn, *args)`` in a transaction (``PgConnections``).
        name: the store, as a write's errors name it.
        call_timeout: seconds a write may wait in the queue (``None``: as long as it takes).
        committed: called after each batch committed, or failed (a write of this store ended).
        many: for an op, the statement that does a batch's writes of that op at once
            (``_grouped``).
        after: ``after(conn)``, last in each batch's transaction (pruning ended runs).
        first: ``first(conn, [(op, args), ...])``, first in each batch's transaction (the
            requests its writes will touch locked, ``_order``).
    """

    # The most writes one transaction takes: a bound on what one batch holds the loop for
    # when its callers are told, and on what one failure fails.
    batch_max = 1024
    # Batches in flight at once, each on its own connection: a write that comes while one
    # commits starts the next at once rather than waiting for that commit, and the two
    # share the server's WAL flush. (One at a time, a run's writes each waited for up to
    # two commits when a few runs went together.)
    parallel = 2

    def __init__(
        self,
        in_transaction: InTransaction,
        *,
        name: str,
        call_timeout: float | None,
        committed: Callable[[], None],
        many: Mapping[Any, Many] | None = None,
        after: After | None = None,
        first: First | None = None,
    ) -> None:
        self._in_transaction = in_transaction
        self._many: Mapping[Any, Many] = many or {}
        self._after: After = after or _nothing_after
        self._first = first
        self._name = name
        self._timeout = call_timeout
        self._committed = committed
        self._queue: list[Queued] = []
        self._due: list[float] = []
        self._committers: set[asyncio.Task[None]] = set()
        self._flushed = anyio.Event()  # set whenever no write is in flight
        self._flushed.set()

    def write(
        self, op: Callable[..., Awaitable[Any]], args: tuple[Any, ...], tell: Tell | None
    ) -> Any:
        """Queue ``op(conn, *args)``; the future is done once its transaction committed
        (its value; or the refusal it raised or returned, raised)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((op, args, tell, future))
        if self._timeout is not None:
            self._due.append(time.monotonic() + self._timeout)
        if len(self._committers) < self.parallel and len(self._queue) == 1:
            if not self._committers:
                self._flushed = anyio.Event()
            task = loop.create_task(self._commit_queue(), name=f"{self._name} commits")
            self._committers.add(task)
        return future

    async def _commit_queue(self) -> None:
        try:
            while self._queue:
                most = self.batch_max
                batch = self._queue[:most]
                del self._queue[:most]
                due = self._due[:most]
                del self._due[:most]
                live, seconds = self._in_time(batch, due)
                if live:
                    # A deadline, not a length: waiting for a connection takes from it.
                    deadline = None if seconds is None else time.monotonic() + seconds
                    await self._commit(live, deadline)
        except BaseException as exc:
            left, self._queue, self._due = self._queue, [], []
            for *_, future in left:
                if not future.done():
                    future.set_exception(self._interrupted(exc))
            raise
        finally:
            self._committers.discard(asyncio.current_task())
            if not self._committers:
                self._flushed.set()

    async def flushed(self) -> None:
        """Wait until no write is in flight (the queue committed, or failed)."""
        await self._flushed.wait()

    def _in_time(self, batch: list[Queued], due: list[float]) -> tuple[list[Queued], float | None]:
        """The writes of ``batch`` still in time, and the seconds left to the earliest of
        them (``None``: no ``call_timeout``); the others are failed, never tried."""
        if not due:
            return batch, None
        return in_time(
            batch,
            due,
            lambda item: item[3],
            lambda: StoreUnavailableError(
                f"{self._name}: this write waited {self._timeout:g} s behind writes"
                " held up (the database slow or unreachable); it was not committed"
            ),
        )

    def _interrupted(self, cause: BaseException) -> StoreError:
        return StoreError(
            f"{self._name}: the commit was interrupted ({type(cause).__name__});"
            " this write may or may not be committed"
        )

    async def _commit(
        self, batch: list[Queued], deadline: float | None, conflicts: int = 0
    ) -> None:
        try:
            outcomes = await self._in_transaction(
                _apply, batch, deadline, self._many, self._after, self._first
            )
        except StoreUnavailableError as exc:
            if not isinstance(exc, ConflictError):
                _fail(batch, exc)
            elif len(batch) > 1:
                # Rolled back to undo a deadlock with another worker's batch (two batches
                # can lock the same rows in two orders): each write alone.
                for item in batch:
                    await self._commit([item], deadline)
            elif conflicts < _CONFLICT_TRIES:
                # A lone write can still be the victim of a deadlock with other workers'
                # batches; nothing of it was committed, and the winner holds nothing now.
                await self._commit(batch, deadline, conflicts + 1)
            else:
                _fail(batch, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch, exc)
            else:  # one write's statement failed: each alone, so it fails alone
                for item in batch:
                    await self._commit([item], deadline)
                return
        except BaseException as exc:
            _fail(batch, self._interrupted(exc))
            raise
        else:
            for item, outcome in zip(batch, outcomes, strict=True):
                future = item[3]
                if future.done():  # its caller was cancelled meanwhile
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        finally:
            self._committed()


# How often a lone write rolled back by a conflict goes again before its caller is told.
_CONFLICT_TRIES = 3


def _fail(batch: list[Queued], exc: BaseException) -> None:
    for *_, future in batch:
        if not future.done():
            future.set_exception(exc)


async def _apply(
    conn: Any,
    batch: list[Queued],
    deadline: float | None,
    many: Mapping[Any, Many],
    after: After,
    first: First | None,
) -> list[Any]:
    """``first`` (if any), every write of ``batch`` on ``conn``, inside its transaction,
    then ``after(conn)`` and their NOTIFYs; each statement bounded by what is left to ``deadline``
    (``time.monotonic()``, the earliest write's: a lock held too long fails the batch in
    time, and no caller waits past its timeout). The writes of a kind that has a grouped
    statement (``many``) go as one, those it did not write alone after (``_grouped``)."""
    if deadline is not None:
        budget = deadline - time.monotonic()
        if budget <= 0.001:
            raise TimeoutError("no time was left for this batch of writes")
        await conn.execute(f"SET LOCAL statement_timeout = {max(1, int(budget * 1000))}")
    if first is not None:
        await first(conn, [(op, args) for op, args, _, _ in batch])
    outcomes: list[Any] = [AGAIN] * len(batch)
    kinds: dict[Any, list[int]] = {}
    for index, (op, *_) in enumerate(batch):
        if op in many:
            kinds.setdefault(op, []).append(index)
    for op, indexes in kinds.items():
        if len(indexes) > 1:
            done = await many[op](conn, [batch[i][1] for i in indexes])
            for i, outcome in zip(indexes, done, strict=True):
                outcomes[i] = outcome
    for index, (op, args, _, _) in enumerate(batch):
        if outcomes[index] is not AGAIN:
            continue
        try:
            outcomes[index] = await op(conn, *args)
        except ToolnexusError as refused:
            outcomes[index] = refused
    await after(conn)
    told: list[Notice] = []
    for (_, _, tell, _), outcome in zip(batch, outcomes, strict=True):
        if tell is not None and not isinstance(outcome, BaseException):
            told.extend(tell(outcome))
    if told:
        channels, payloads = notices(told)
        await conn.execute(_NOTIFY, channels, payloads)
    return outcomes
