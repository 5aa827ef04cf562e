"""``PostgresRunStore``: the run journal in PostgreSQL, shared by every worker on it.

Rules of this module:

- Every write is one transaction on a pooled connection, committed before the write
  returns: with PostgreSQL's defaults (``fsync``, ``synchronous_commit`` on) what it wrote
  survives a crash of the worker and of the database server. Concurrent transactions
  share WAL flushes in the server, so there is no batching of our own.
- asyncpg is imported when the store is made, not with the package: it is the optional
  ``postgres`` extra.
- The DSN may hold a password: it is never shown. Errors and the repr name the database
  as ``host:port/dbname`` only, and asyncpg's own messages are scrubbed of the DSN's
  secrets before they are shown.
- One extra connection, opened by the first :meth:`PostgresRunStore.listen`, LISTENs on
  the store's channel and hands each event to the listeners. If it drops, events are
  missed until it is opened again (at the next call that reads the store); hosts look at
  the store every few seconds regardless, so a missed event delays, never loses.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio

from .._errors import StoreError, StoreUnavailableError, ToolnexusError, UsageError
from .._results import RunResult, ToolCallRecord, record_to_json
from .._secrets import Scrubber
from .._types import Answer, Request
from .._wire import named_digest
from . import _pg_queries as pg_queries
from ._decide import saved
from ._pg_ops import CHANNEL, PgOps, event_payload
from ._pg_schema import ensure, qualified
from ._schema import encode, prompt_of, state_text
from ._store import Accepted, RunSummary, StoredRequest, StoredRun, StoreEvent

__all__ = ("PostgresRunStore",)

log = logging.getLogger("toolnexus_async.durable")

T = TypeVar("T")

DEFAULT_KEEP_FINISHED = 10_000


def _where(dsn: str) -> str:
    """The server a DSN names, for messages: ``host:port/dbname``, or the socket directory
    and port of a Unix-socket DSN (``host=`` in the query, or a host that is a path); no
    user, no password, no other options."""
    try:
        parts = urlsplit(dsn)
        query = dict(parse_qsl(parts.query))
        host = unquote(parts.hostname or "") or query.get("host", "")
        port = parts.port or int(query.get("port", "") or 5432)
    except ValueError:
        return "postgresql database"
    dbname = parts.path if parts.path not in ("", "/") else "/" + query.get("dbname", "")
    if host.startswith("/"):
        return f"postgresql socket {host}/.s.PGSQL.{port} {dbname.lstrip('/') or '(default db)'}"
    return f"postgresql {host or 'localhost'}:{port}{dbname}"


# SQLSTATE classes and codes of a passing fault: the connection (08), too few resources
# (53: too many connections, disk full), the server stopping or restarting (57: admin or
# crash shutdown, cannot connect now, a statement cancelled by its timeout), a lock not
# had in time (55P03) and a transaction the server rolled back to resolve a conflict
# (40: serialization, deadlock). Retrying later is right for each; for every other error
# (a constraint, a syntax error, a bad value) it is not.
_PASSING_CLASSES = ("08", "53", "57", "40")
_PASSING_CODES = ("55P03",)


def passing(exc: BaseException, asyncpg: Any) -> bool:
    """Whether ``exc``, raised by asyncpg or the socket under it, is a passing fault."""
    if isinstance(exc, OSError | TimeoutError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        code = str(getattr(exc, "sqlstate", "") or "")
        return code[:2] in _PASSING_CLASSES or code in _PASSING_CODES
    # asyncpg's client-side errors: a connection closed under a call, or one left in a
    # state it cannot go on from by a server that ended it (InternalClientError "another
    # operation is in progress"); its DataError (a bad argument) is a bug, not a fault.
    if isinstance(exc, asyncpg.InternalClientError):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and not isinstance(exc, ValueError)


async def _nothing_to_reset(conn: Any) -> None:
    return None


async def _select_one(conn: Any) -> None:
    await conn.fetchval("SELECT 1")


def _secrets_of(dsn: str) -> tuple[str, ...]:
    """The DSN's password (in the userinfo or the query), as written and decoded, and the
    DSN itself. A user name is not a secret here: ``postgres`` would otherwise be
    scrubbed out of every ``postgresql`` in a message."""
    try:
        parts = urlsplit(dsn)
        password = parts.password
    except ValueError:
        return (dsn,)
    query = [v for k, v in parse_qsl(parts.query) if k == "password" and v]
    found = [p for p in (password, *query) if p]
    return tuple(dict.fromkeys((*found, *(unquote(p) for p in found), dsn)))


class PostgresRunStore:
    """A :class:`RunStore` in a PostgreSQL database, shared by every worker on it.

    The connection pool is opened on first use or by ``async with``; :meth:`aclose`
    closes it. The tables are created in ``schema`` on first use.

    Args:
        dsn: ``postgresql://user:password@host:port/dbname`` (any form asyncpg accepts).
        schema: the PostgreSQL schema the tables live in (created if missing).
        min_size, max_size: the pool's connections (each write holds one for its
            transaction; a worker needs about as many as it has writes in flight).
        keep_finished: how many ended runs are kept, the most recent.
        prune_every: seconds between two prunings of the ended runs beyond
            ``keep_finished`` (done by whichever write ends a run then): finding them costs
            a scan of ``keep_finished`` index entries, too much for every ended run.
        command_timeout: seconds a statement may take (a lock held too long included)
            before it fails with :class:`StoreUnavailableError`.
        call_timeout: seconds a whole call may take, the wait for a pooled connection
            included, before it fails with :class:`StoreUnavailableError`; ``None`` (the
            default): a call waits for a connection as long as it takes (a burst slows
            down rather than fails) and each statement is bounded by ``command_timeout``.
            A server answering requests sets it (``serve`` uses ``--store-timeout``), so
            that no request waits past it while the pool is held up.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "toolnexus",
        min_size: int = 2,
        max_size: int = 10,
        keep_finished: int = DEFAULT_KEEP_FINISHED,
        prune_every: float = 10.0,
        command_timeout: float = 30.0,
        call_timeout: float | None = None,
    ) -> None:
        try:
            import asyncpg
        except ImportError as exc:  # the optional extra is not installed
            raise UsageError(
                "PostgresRunStore needs asyncpg: pip install 'toolnexus-async[postgres]'"
            ) from exc
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            raise UsageError("dsn must be a postgresql:// URL")
        if keep_finished < 0:
            raise UsageError(f"keep_finished must be >= 0, got {keep_finished}")
        if call_timeout is not None and not 0 < call_timeout < float("inf"):
            raise UsageError(f"call_timeout must be > 0 seconds and finite, got {call_timeout}")
        if not 1 <= min_size <= max_size:
            raise UsageError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
        self._asyncpg = asyncpg
        self._dsn = dsn
        self.where = _where(dsn)
        self.schema = qualified(schema)
        self._ops = PgOps(self.schema)
        self._scrub = Scrubber(_secrets_of(dsn))
        self._pool_options = {
            "min_size": min_size,
            "max_size": max_size,
            "command_timeout": command_timeout,
            # Our transactions leave no session state behind (no LISTEN, no session
            # locks, no SET), so asyncpg's reset, one more round trip per write, is skipped.
            "reset": _nothing_to_reset,
        }
        self._keep = keep_finished
        self._prune_every = prune_every
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
        self._listeners: list[Callable[[StoreEvent], None]] = []
        self._listening: Any = None  # the LISTEN connection, once a listener came
        self._pruned = 0.0

    def __repr__(self) -> str:
        return f"PostgresRunStore({self.where!r}, schema={self.schema!r})"

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._connected()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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

    async def _connected(self) -> Any:
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
                        await ensure(conn, self.schema, self.where)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
        return self._pool

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def _failures(self) -> tuple[type[BaseException], ...]:
        """What a statement or a connection raises when the database fails it."""
        asyncpg = self._asyncpg
        return (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,
            TimeoutError,
        )

    def _error(self, what: str, exc: BaseException) -> StoreError:
        text = self._scrub(f"{self.where}: {what}: {type(exc).__name__}: {exc}")
        if passing(exc, self._asyncpg):
            return StoreUnavailableError(f"{text} (the database is unavailable now)")
        return StoreError(text)

    async def _in_transaction(
        self,
        op: Callable[..., Awaitable[T | Exception]],
        *args: Any,
        tell: Callable[[T], StoreEvent] | None = None,
    ) -> T:
        """``op(conn, *args)`` in a transaction; refusals it returns are raised after the
        commit (what they changed is kept), refusals it raises roll it back.

        ``tell(outcome)`` is the event to announce once the transaction committed, with a
        NOTIFY of its own: PostgreSQL serialises the commits of transactions that notify,
        flush and all, so a NOTIFY inside the write would cost every write a disk flush
        of its own instead of sharing flushes with the writes committing with it. A
        notification-only transaction writes nothing that needs a flush. Telling may fail
        (a dropped connection): the write stands, and the event is missed (listeners
        look at the store every few seconds anyway).

        Waiting for a pooled connection has no deadline of its own (unless
        ``call_timeout``) and can be cancelled: a burst of writes queues for the pool rather
        than fails, and every transaction ahead in the queue is bounded by
        ``command_timeout``. The transaction itself is
        shielded from anyio cancellation (a cancel scope, a time limit): it takes effect
        once the transaction is over (committed or rolled back), never in the middle of
        it, which would leave a connection in an unknown state and the caller not knowing
        whether its write committed. A native asyncio cancellation (``asyncio.timeout``,
        ``Task.cancel``) is not held off by an anyio shield: that caller is not told
        whether its write committed (PostgreSQL keeps it whole or not at all), and no
        other caller's write depends on it, each being a transaction of its own.
        """
        self._busy += 1
        if self._busy == 1:
            self._idle = anyio.Event()
        try:
            pool = await self._connected()  # counted: a pool opened meanwhile is closed too
            failures = self._failures()
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
                            if passing(exc, self._asyncpg):
                                # A connection that saw a fault (the server ended it, a
                                # statement timed out mid-protocol) is not trusted again:
                                # the pool opens a new one in its place.
                                conn.terminate()
                            raise
                        if tell is not None and not isinstance(outcome, Exception):
                            await self._notify(conn, tell(outcome))
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

    async def _notify(self, conn: Any, event: StoreEvent) -> None:
        try:
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, event_payload(event))
        except self._failures() as exc:
            log.warning("%s", self._error(f"{event.kind} {event.request_id!r} not announced", exc))

    async def _ended(self, conn: Any, now: float) -> None:
        """Prune ended runs beyond the bound, at most every few seconds."""
        if now - self._pruned >= self._prune_every:
            self._pruned = now
            await self._ops.prune(conn, self._keep, now)

    # -- the contract --------------------------------------------------------------------------

    async def start(self, state: RunResult, owner: str, lease_until: float, turn: int = 0) -> None:
        text, prompt = state_text(state), prompt_of(state)
        await self._in_transaction(
            self._ops.start, state.run_id, owner, lease_until, turn, text, prompt, time.time()
        )

    async def turn(self, state: RunResult, turn: int, owner: str) -> None:
        text = state_text(state)
        await self._in_transaction(self._ops.turn, state.run_id, turn, owner, text, time.time())

    async def record(self, run_id: str, record: ToolCallRecord, owner: str) -> None:
        text = encode(record_to_json(record), f"the result of call {record.call.id!r}")
        await self._in_transaction(self._ops.record, run_id, record.call.id, owner, text)

    async def suspend(self, run_id: str, call_id: str, request: Request, owner: str) -> None:
        body = encode(request.to_dict(), f"request {request.id!r}")
        left = request.seconds_left()
        expires = None if left is None else time.time() + left
        event = StoreEvent("requested", request.id, run_id, owner)
        await self._in_transaction(
            self._ops.suspend,
            run_id,
            call_id,
            owner,
            request.id,
            body,
            expires,
            tell=lambda _: event,
        )

    async def halt(self, run_id: str, owner: str) -> None:
        await self._in_transaction(self._ops.halt, run_id, owner, time.time())

    async def finish(self, result: RunResult, owner: str) -> None:
        final, now = state_text(result), time.time()

        async def finish(conn: Any) -> None:
            await self._ops.finish(conn, result.run_id, owner, final, now)
            await self._ended(conn, now)

        await self._in_transaction(finish)

    async def fail(self, run_id: str, error: str, owner: str) -> None:
        now = time.time()

        async def fail(conn: Any) -> None:
            await self._ops.fail(conn, run_id, error, owner, now)
            await self._ended(conn, now)

        await self._in_transaction(fail)

    async def release(self, run_id: str, owner: str) -> None:
        await self._in_transaction(self._ops.release, run_id, owner, time.time())

    async def save(self, run: RunResult) -> None:
        await self._in_transaction(self._ops.save, saved(run), time.time())

    async def accept(self, answer: Answer, now: float, *, delivered: bool = False) -> Accepted:
        text = encode(answer.to_dict(), f"the answer to {answer.id!r}")

        def answered(taken: Accepted) -> StoreEvent:
            return StoreEvent("answered", answer.id, taken.run_id, taken.owner, delivered)

        return await self._in_transaction(
            self._ops.accept, answer.id, text, now, delivered, named_digest(answer), tell=answered
        )

    async def claim(
        self, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | None:
        return await self._in_transaction(self._ops.claim, run_id, owner, lease_until, now)

    async def renew(self, owner: str, lease_until: float) -> None:
        await self._in_transaction(self._ops.renew, owner, lease_until)

    async def ping(self) -> None:
        """One round trip to the database; :class:`StoreUnavailableError` if it fails."""
        await self._in_transaction(_select_one)

    async def ready(self, now: float, limit: int) -> list[str]:
        await self._keep_listening()
        return await self._in_transaction(pg_queries.ready, self.schema, now, limit)

    async def deliveries(self, owner: str) -> list[tuple[str, Answer]]:
        return await self._in_transaction(pg_queries.deliveries, self.schema, owner)

    async def delivered(self, request_ids: list[str]) -> None:
        await self._in_transaction(self._ops.delivered, list(request_ids))

    async def requests(self, now: float | None = None) -> list[Request]:
        return [stored.request for stored in await self.outstanding(now)]

    async def outstanding(self, now: float | None = None) -> list[StoredRequest]:
        at = time.time() if now is None else now
        return await self._in_transaction(pg_queries.outstanding, self.schema, at)

    async def find(self, request_id: str) -> StoredRequest:
        return await self._in_transaction(pg_queries.find, self.schema, request_id)

    async def load(self, run_id: str) -> StoredRun:
        return await self._in_transaction(pg_queries.load, self.schema, run_id)

    async def runs(self, limit: int = 1000) -> list[RunSummary]:
        return await self._in_transaction(pg_queries.runs, self.schema, limit)

    # -- being told ------------------------------------------------------------------------

    async def listen(self, callback: Callable[[StoreEvent], None]) -> Callable[[], None]:
        """Events committed by any worker on the database (through LISTEN/NOTIFY)."""
        self._listeners.append(callback)
        await self._keep_listening()

        def stop() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return stop

    async def _keep_listening(self) -> None:
        """Open the LISTEN connection if there are listeners and it is not open."""
        if not self._listeners or self._closed:
            return
        if self._listening is not None and not self._listening.is_closed():
            return
        await self._connected()
        async with self._opening:  # one LISTEN connection, however many callers race here
            if self._closed or (self._listening is not None and not self._listening.is_closed()):
                return
            asyncpg = self._asyncpg
            with anyio.CancelScope(shield=True):  # a connection half made would leak
                conn: Any = None
                failures = self._failures()
                try:
                    conn = await asyncpg.connect(self._dsn, timeout=self._timeout)
                    await conn.add_listener(CHANNEL, self._notified)
                except failures as exc:
                    if conn is not None:
                        await self._quietly(conn.close())
                    log.warning(
                        "%s", self._error("cannot listen for events (hosts will look instead)", exc)
                    )
                    return
            if self.closed:  # closed while connecting: aclose did not see this one
                await self._quietly(conn.close())
                return
            stale, self._listening = self._listening, conn
            if stale is not None:
                await self._quietly(stale.close())

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            data = json.loads(payload)
            event = StoreEvent(
                data["kind"],
                data["request"],
                data["run"],
                data["owner"],
                bool(data.get("delivered", False)),
            )
        except (ValueError, KeyError, TypeError):
            log.warning("%s: an event that is not ours on %s: %.200r", self.where, channel, payload)
            return
        for callback in tuple(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("a run store listener raised on %r", event)
