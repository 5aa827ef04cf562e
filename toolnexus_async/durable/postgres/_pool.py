"""``PgConnections``: the connections a :class:`PostgresRunStore` writes and listens on.

Rules of this module:

- Every call is one transaction on a pooled connection (:meth:`PgConnections.in_transaction`),
  committed before the call returns: with PostgreSQL's defaults (``fsync``,
  ``synchronous_commit`` on) what it wrote survives a crash of the worker and of the
  database server. The store's writes come here from its group commit (``_committer``),
  many writes a transaction; its reads come here one by one.
- A transaction, once it has its connection, is not cut short by anyio cancellation, and
  a connection that saw a passing fault is not used again.
- One extra connection, opened by the first :meth:`PgConnections.listen`, LISTENs on the
  channels asked for (a worker's own, or the one of every event, ``_ops.CHANNEL``, with
  the shared advisory lock that tells writers someone listens there) and hands each
  event to that channel's listeners. If it drops (the database restarted, the session
  was ended), events are missed until it is opened again, by the next read of the store
  that succeeds (:meth:`PgConnections.read`: a host's own looks, every ``poll``, are
  reads). Hosts look at the store every few seconds regardless, so a missed event
  delays, never loses. A LISTEN connection that cannot be opened is told once, until
  one is opened again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ..._core.errors import ToolnexusError, UsageError
from .._run_events import Watchers
from .._store import StoreEvent
from ._errors import QUIET_FLOOR, PgErrors
from ._ops import CHANNEL, LISTENING_LOCK
from ._schema import ensure

__all__ = ("PgConnections",)

log = logging.getLogger("toolnexus_async.durable")

T = TypeVar("T")


async def _nothing_to_reset(conn: Any) -> None:
    return None


class PgConnections:
    """The pool (opened on first use) and the LISTEN connection of one store.

    Args:
        asyncpg: the asyncpg module (imported by the store, not here).
        dsn: the database's DSN.
        schema: the (quoted) schema the tables live in, created on first use.
        min_size, max_size, command_timeout, call_timeout: as :class:`PostgresRunStore`.
    """

    def __init__(
        self,
        asyncpg: Any,
        dsn: str,
        schema: str,
        *,
        min_size: int,
        max_size: int,
        command_timeout: float,
        call_timeout: float | None,
    ) -> None:
        self._asyncpg = asyncpg
        self._dsn = dsn
        self._schema = schema
        self._error = PgErrors(dsn, asyncpg)
        self.where = self._error.where
        self._pool_options = {
            "min_size": min_size,
            "max_size": max_size,
            "command_timeout": command_timeout,
            # Our transactions leave no session state behind (no LISTEN, no session
            # locks, no SET), so asyncpg's reset, one more round trip per write, is skipped.
            "reset": _nothing_to_reset,
            # No JIT: the server compiles a statement it estimates costly (a listing's
            # counts over a table not yet analysed) in 15-20 ms, for work of under 1 ms.
            "server_settings": {"jit": "off"},
        }
        self._timeout = command_timeout
        self._call_timeout = call_timeout
        self._pool: Any = None
        self._opening = anyio.Lock()
        self._closed = False
        # The calls under way, which aclose() lets finish before it closes the pool: one
        # waiting for a pooled connection would otherwise be refused ("pool is closing"),
        # and one given a connection while the pool closes would lose it mid-transaction.
        self._busy = 0
        self._idle = anyio.Event()
        self._idle.set()
        # The callbacks of each channel listened on, and the channels the LISTEN
        # connection has added.
        self._listeners: dict[str, list[Callable[[StoreEvent], None]]] = {}
        self._heard: set[str] = set()
        # Told after each write here, and each event heard: a write of this store ended.
        self.committed = Watchers()
        self._listening: Any = None  # the LISTEN connection, once a listener came
        self._unheard = False  # a LISTEN connection could not be opened, and was told so

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the listening connection and the pool; idempotent. The calls made before
        end first (each is bounded by ``command_timeout`` once it has a connection)."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._idle.wait()
            listening, self._listening = self._listening, None
            if listening is not None:
                await self._quietly(listening.close())
            pool, self._pool = self._pool, None
            if pool is not None:
                QUIET_FLOOR.discard(pool)
                with anyio.move_on_after(10) as waited:
                    await self._quietly(pool.close())
                if waited.cancelled_caught:  # a connection hung: do not wait forever
                    pool.terminate()

    @staticmethod
    async def _quietly(closing: Awaitable[Any]) -> None:
        try:
            await closing
        except Exception as exc:  # closing what already broke: nothing more to do
            log.debug("closing a PostgreSQL connection: %r", exc)

    async def connected(self) -> Any:
        """The pool, opened (and the schema made) if it is not yet."""
        if self._closed:
            raise UsageError("this run store is closed")
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                try:
                    pool = await self._asyncpg.create_pool(self._dsn, **self._pool_options)
                except (OSError, self._asyncpg.PostgresError, self._asyncpg.InterfaceError) as exc:
                    raise self._error("cannot be opened", exc) from None
                try:
                    async with pool.acquire() as conn:
                        await ensure(conn, self._schema, self.where)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
                QUIET_FLOOR.add(pool, self.where)
        return self._pool

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    # -- writing -------------------------------------------------------------------------------

    async def in_transaction(self, op: Callable[..., Awaitable[T | Exception]], *args: Any) -> T:
        """``op(conn, *args)`` in a transaction; refusals it returns are raised after the
        commit (what they changed is kept), refusals it raises roll it back.

        Waiting for a pooled connection has no deadline of its own (unless
        ``call_timeout``) and can be cancelled: a burst queues for the pool rather than
        fails, and every transaction ahead in the queue is bounded by ``command_timeout``.
        The transaction itself is shielded from anyio cancellation (a cancel scope, a time
        limit): it takes effect once the transaction is over (committed or rolled back),
        never in the middle of it, which would leave a connection in an unknown state and
        the caller not knowing whether its write committed. A native asyncio cancellation
        (``asyncio.timeout``, ``Task.cancel``) is not held off by an anyio shield: that
        caller is not told whether its transaction committed (PostgreSQL keeps it whole or
        not at all). The store's writes do not come here directly: its group commit
        (``_committer``) does, from a task no caller's cancellation reaches.
        """
        self._busy += 1
        if self._busy == 1:
            self._idle = anyio.Event()
        try:
            pool = await self.connected()  # counted: a pool opened meanwhile is closed too
            failures = self._error.failures()
            began = time.monotonic()
            limit = self._call_timeout
            try:
                async with pool.acquire(timeout=limit) as conn:
                    left = self._left(limit, time.monotonic() - began)
                    with anyio.CancelScope(shield=True):
                        try:
                            async with conn.transaction():
                                if left is not None:
                                    await self._within(conn, left)
                                outcome = await op(conn, *args)
                        except failures as exc:
                            if self._error.passing(exc):
                                # A connection that saw a fault (the server ended it, a
                                # statement timed out mid-protocol) is not trusted again:
                                # the pool opens a new one in its place.
                                self._drop(conn)
                            raise
            except ToolnexusError:
                raise
            except failures as exc:
                raise self._error("failed", exc) from None
        finally:
            self._busy -= 1
            if not self._busy:
                self._idle.set()
        if isinstance(outcome, Exception):
            raise outcome
        result: T = outcome
        return result

    def _drop(self, conn: Any) -> None:
        """Terminate ``conn``, unless the server ended it and the pool took it back already
        (asyncpg refuses to terminate it then): the fault told is the server's, not that."""
        try:
            conn.terminate()
        except self._asyncpg.InterfaceError:
            pass

    async def read(self, op: Callable[..., Awaitable[T | Exception]], *args: Any) -> T:
        """:meth:`in_transaction`, for a read; once it succeeded, the LISTEN connection is
        opened again if it dropped (the database answers: it is likely to open, and an
        outage costs no connection attempt more than its reads)."""
        outcome: T = await self.in_transaction(op, *args)
        if self._listeners and not self._closed:
            listening = self._listening
            if listening is None or listening.is_closed():
                await self.keep_listening()
        return outcome

    def _left(self, limit: float | None, waited: float) -> float | None:
        """What is left of ``call_timeout`` for the statements, when the wait for the
        connection took enough of it (a tenth) that ``command_timeout`` would overrun it."""
        if limit is None:
            return None
        left = limit - waited
        return left if left < 0.9 * min(limit, self._timeout) else None

    async def _within(self, conn: Any, left: float) -> None:
        """One deadline per call (``call_timeout``): what waiting for a connection took
        (the pool full of writes held up by a lock, say) is taken from what its statements
        may take, so a call fails within about ``call_timeout``, not twice that. Only when
        the wait took some of it: it costs a round trip."""
        if left <= 0.001:
            raise TimeoutError("no time was left after waiting for a pooled connection")
        await conn.execute(f"SET LOCAL statement_timeout = {max(1, int(left * 1000))}")

    # -- being told ------------------------------------------------------------------------

    async def listen(
        self, callback: Callable[[StoreEvent], None], channel: str = CHANNEL
    ) -> Callable[[], None]:
        """Events committed by any worker on the database and told on ``channel``
        (LISTEN/NOTIFY): :data:`CHANNEL` tells them all, a worker's own channel the
        answers it must act on (``_ops.routes``)."""
        self._listeners.setdefault(channel, []).append(callback)
        listening = self._listening
        if listening is not None and not listening.is_closed() and channel not in self._heard:
            try:
                await self._add(listening, channel)
                self._heard.add(channel)
            except self._error.failures() as exc:
                self._cannot_listen(exc)
        await self.keep_listening()

        def stop() -> None:
            callbacks = self._listeners.get(channel, [])
            if callback in callbacks:
                callbacks.remove(callback)

        return stop

    async def keep_listening(self) -> None:
        """Open the LISTEN connection if there are listeners and it is not open (never
        opened, or dropped: the database restarted, the session was ended)."""
        if not self._listeners or self._closed:
            return
        if self._listening is not None and not self._listening.is_closed():
            return
        await self.connected()
        async with self._opening:  # one LISTEN connection, however many callers race here
            if self._closed or (self._listening is not None and not self._listening.is_closed()):
                return
            asyncpg = self._asyncpg
            with anyio.CancelScope(shield=True):  # a connection half made would leak
                conn: Any = None
                failures = self._error.failures()
                channels = set(self._listeners)
                try:
                    conn = await asyncpg.connect(self._dsn, timeout=self._timeout)
                    for channel in channels:
                        await self._add(conn, channel)
                except failures as exc:
                    if conn is not None:
                        await self._quietly(conn.close())
                    self._cannot_listen(exc)
                    return
            if self.closed:  # closed while connecting: aclose did not see this one
                await self._quietly(conn.close())
                return
            stale, self._listening, self._heard = self._listening, conn, channels
            if self._unheard:
                self._unheard = False
                log.info("%s: listening for events again", self.where)
            if stale is not None:
                await self._quietly(stale.close())

    def _cannot_listen(self, exc: BaseException) -> None:
        """Told once until a LISTEN connection opens again: each look at the store may try
        again, and an outage is one line, not one per look."""
        if not self._unheard:
            self._unheard = True
            log.warning(
                "%s", self._error("cannot listen for events (hosts will look instead)", exc)
            )

    async def _add(self, conn: Any, channel: str) -> None:
        """LISTEN on ``channel``; on :data:`CHANNEL`, also say so to the writers (the shared
        advisory lock they look for before they notify there), for as long as ``conn``
        lives."""
        await conn.add_listener(channel, self._notified)
        if channel == CHANNEL:
            await conn.execute(f"SELECT pg_advisory_lock_shared({LISTENING_LOCK})")

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """``callback()`` after each write here (:meth:`committed`) and each event heard."""
        return self.committed.add(callback)

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self.committed()
        try:
            bodies = json.loads(payload)
            events = [
                StoreEvent(
                    data["kind"],
                    data["request"],
                    data["run"],
                    data["owner"],
                    bool(data.get("delivered", False)),
                )
                for data in bodies
            ]
        except (ValueError, KeyError, TypeError):
            log.warning("%s: an event that is not ours on %s: %.200r", self.where, channel, payload)
            return
        for event in events:
            for callback in tuple(self._listeners.get(channel, ())):
                try:
                    callback(event)
                except Exception:
                    log.exception("a run store listener raised on %r", event)
