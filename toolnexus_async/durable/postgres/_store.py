"""``PostgresRunStore``: the run journal in PostgreSQL, shared by every worker on it.

Rules of this module:

- Every write is committed before the write returns, in a transaction it shares with the
  writes queued with it (``_committer``: group commit, its events' NOTIFYs inside; the
  answers in batches of their own), except a lease renewal, which is a transaction of its
  own that waits behind no batch; every
  read is one transaction (the connections and the LISTEN connection are ``_pool``'s; how
  the database's failures are told, ``_errors``'s; the statements, ``_ops``'s and
  ``_queries``'s). This module holds the :class:`RunStore` contract's methods.
- asyncpg is imported when the store is made, not with the package: it is the optional
  ``postgres`` extra.
- The DSN may hold a password: it is never shown. The repr names the database as
  ``host:port/dbname`` only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Self

import anyio

from ..._core.audit import AnswerRecord, check_answered_by
from ..._core.errors import UsageError
from ..._core.results import RunResult, ToolCallRecord, record_to_json
from ..._core.types import Answer, Request
from ..._core.wire import approval_claim
from .. import _run_events as run_events
from .._decide import saved
from .._listing import RequestPage, RequestQuery, RunPage, RunQuery, RunView
from .._rows import encode, plain, prompt_of, state_text
from .._run_events import EventRead, expired_request, saved_events, started_events
from .._store import Accepted, RunSummary, StoredRequest, StoredRun, StoreEvent
from . import _queries as pg_queries
from ._asked import Asked
from ._committer import GroupCommit, Notice, Tell
from ._grouped import Grouped
from ._ops import CHANNEL, PgOps, owner_channel, routes
from ._order import RequestsFirst
from ._pool import PgConnections
from ._schema import qualified

__all__ = ("PostgresRunStore",)

DEFAULT_KEEP_FINISHED = 10_000


async def _select_one(conn: Any) -> None:
    await conn.fetchval("SELECT 1")


class PostgresRunStore:
    """A :class:`RunStore` in a PostgreSQL database, shared by every worker on it.

    The connection pool is opened on first use or by ``async with``; :meth:`aclose`
    closes it. The tables are created in ``schema`` on first use.

    Args:
        dsn: ``postgresql://user:password@host:port/dbname`` (any form asyncpg accepts).
        schema: the PostgreSQL schema the tables live in (created if missing).
        min_size, max_size: the pool's connections (the writes, grouped, use at most
            four at a time, two for the runs' writes and two for answers; each read
            holds one for its transaction).
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
                "PostgresRunStore needs asyncpg: pip install -e '.[postgres]' in the "
                "toolnexus-async checkout (or pip install 'asyncpg>=0.30')"
            ) from exc
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            raise UsageError("dsn must be a postgresql:// URL")
        if keep_finished < 0:
            raise UsageError(f"keep_finished must be >= 0, got {keep_finished}")
        if call_timeout is not None and not 0 < call_timeout < float("inf"):
            raise UsageError(f"call_timeout must be > 0 seconds and finite, got {call_timeout}")
        if not 1 <= min_size <= max_size:
            raise UsageError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
        self.schema = qualified(schema)
        self._pg = PgConnections(
            asyncpg,
            dsn,
            self.schema,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            call_timeout=call_timeout,
        )
        self.where = self._pg.where
        # A read is one transaction on a pooled connection (then the LISTEN connection is
        # opened again if the database dropped it); the writes share theirs.
        self._in_transaction = self._pg.in_transaction
        self._read = self._pg.read
        self._ops = PgOps(self.schema)
        self._closing = False
        grouped = Grouped(self.schema, self._ops)
        self._asked = Asked(self.schema, self._ops, grouped)
        commits = partial(
            GroupCommit,
            self._pg.in_transaction,
            name=f"run store {self.where}",
            call_timeout=call_timeout,
            committed=self._pg.committed,
        )
        # A run batch locks the requests its writes will touch first, in id order, as an
        # answer batch does (``_order``): no two batches wait on each other over requests.
        first = RequestsFirst(self.schema, self._ops, also_turns=(self._asked.turn,))
        many = {**grouped.many, self._asked.turn: self._asked.many}
        self._commits = commits(many=many, after=self._ended, first=first)
        # Answers commit in batches of their own. An answer locks its request first; a
        # run's writes lock the run, then its requests: in one transaction the two orders
        # could lock each other in a circle with another worker's batch.
        self._answers = commits(many=grouped.answers)
        self._keep = keep_finished
        self._prune_every = prune_every
        self._pruned = 0.0

    def __repr__(self) -> str:
        return f"PostgresRunStore({self.where!r}, schema={self.schema!r})"

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._pg.connected()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the listening connection and the pool; idempotent. The calls made before
        end first (each is bounded by ``command_timeout`` once it has a connection)."""
        self._closing = True
        with anyio.CancelScope(shield=True):
            await self._commits.flushed()
            await self._answers.flushed()
        await self._pg.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._pg.closed

    async def _ended(self, conn: Any) -> None:
        """Prune ended runs beyond the bound, at most every few seconds (last in each
        batch of writes)."""
        now = time.time()
        if now - self._pruned >= self._prune_every:
            self._pruned = now
            await self._ops.prune(conn, self._keep, now)

    # -- the contract --------------------------------------------------------------------------

    def _check_open(self) -> None:
        """A write after :meth:`aclose` began is refused (reads fail with the pool)."""
        if self._closing:
            raise UsageError("this run store is closed")

    def _written(
        self, op: Any, *args: Any, tell: Tell | None = None, answer: bool = False
    ) -> Awaitable[Any]:
        """A write, queued for the group commit (``answer``: the answers' own): done once
        its transaction committed (then this worker's event feeds look: ``watch``)."""
        self._check_open()
        commits = self._answers if answer else self._commits
        written: Awaitable[Any] = commits.write(op, args, tell)
        return written

    async def start(self, state: RunResult, owner: str, lease_until: float, turn: int = 0) -> None:
        text, prompt, now = state_text(state), prompt_of(state), time.time()
        events = started_events(state, turn)
        await self._written(
            self._ops.start, state.run_id, owner, lease_until, turn, text, prompt, now, events
        )

    async def turn(self, state: RunResult, turn: int, owner: str) -> None:
        text, events = state_text(state), run_events.tool_calls(state)
        await self._written(self._ops.turn, state.run_id, turn, owner, text, time.time(), events)

    async def record(self, run_id: str, record: ToolCallRecord, owner: str) -> None:
        text = encode(record_to_json(record), f"the result of call {record.call.id!r}")
        event, request_id = run_events.tool_result(run_id, record), expired_request(record)
        await self._written(
            self._ops.record, run_id, record.call.id, owner, text, event, request_id, time.time()
        )

    async def suspend(
        self,
        run_id: str,
        call_id: str,
        request: Request,
        owner: str,
        *,
        state: RunResult | None = None,
        turn: int = 0,
        lease_until: float | None = None,
    ) -> None:
        event = StoreEvent("requested", request.id, run_id, owner)
        op, args = self._asked.write(run_id, call_id, request, owner, state, turn, lease_until)
        await self._written(op, *args, tell=lambda _: ((event, routes(event)),))

    async def halt(self, run_id: str, owner: str) -> None:
        await self._written(self._ops.halt, run_id, owner, time.time())

    async def finish(self, result: RunResult, owner: str) -> None:
        final, now, event = state_text(result), time.time(), run_events.done(result)
        await self._written(
            self._ops.finish,
            result.run_id,
            owner,
            final,
            now,
            result.status,
            plain(result.text),
            event,
        )

    async def fail(self, run_id: str, error: str, owner: str) -> None:
        await self._written(self._ops.fail, run_id, error, owner, time.time())

    async def release(self, run_id: str, owner: str) -> None:
        await self._written(self._ops.release, run_id, owner, time.time())

    async def save(self, run: RunResult) -> None:
        await self._written(self._ops.save, saved(run), time.time(), saved_events(run))

    async def accept(
        self,
        answer: Answer,
        now: float,
        *,
        delivered: bool = False,
        by: str | None = None,
        answered_by: str | None = None,
    ) -> Accepted:
        text = encode(answer.to_dict(), f"the answer to {answer.id!r}")
        who = check_answered_by(answered_by)

        def answered(taken: Accepted) -> tuple[Notice, ...]:
            event = StoreEvent("answered", answer.id, taken.run_id, taken.owner, delivered)
            return ((event, routes(event, by)),)

        taken: Accepted = await self._written(
            self._ops.accept,
            answer.id,
            text,
            now,
            delivered,
            approval_claim(answer),
            answer.ok,
            answer.reason,
            by,
            who,
            tell=answered,
            answer=True,
        )
        return taken

    async def claim(
        self, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | None:
        claimed: StoredRun | None = await self._written(
            self._ops.claim, run_id, owner, lease_until, now
        )
        return claimed

    async def renew(self, owner: str, lease_until: float) -> None:
        # A transaction of its own, never queued behind a batch: a batch can wait a second
        # or more on another worker's locks (PostgreSQL's deadlock_timeout), and a lease
        # renewed that late lapses, so that another worker takes over a run whose tool
        # already ran here and runs it again.
        self._check_open()
        await self._in_transaction(self._ops.renew, owner, lease_until)

    # -- the sign-in state of MCP servers (toolnexus_async.mcp.RunStoreTokens) -----------------

    async def mcp_token(self, key: str) -> str | None:
        """The value kept under ``key`` in ``mcp_tokens``, or ``None``."""
        sql = f"SELECT value FROM {self.schema}.mcp_tokens WHERE key = $1"

        async def read(conn: Any) -> str | None:
            value = await conn.fetchval(sql, key)
            return None if value is None else str(value)

        return await self._in_transaction(read)

    async def set_mcp_token(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key`` in ``mcp_tokens`` (``None`` deletes it)."""
        table = f"{self.schema}.mcp_tokens"

        async def write(conn: Any) -> None:
            if value is None:
                await conn.execute(f"DELETE FROM {table} WHERE key = $1", key)
            else:
                await conn.execute(
                    f"INSERT INTO {table} (key, value, updated) VALUES ($1, $2, $3)"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value,"
                    " updated = EXCLUDED.updated",
                    key,
                    value,
                    time.time(),
                )

        await self._in_transaction(write)

    async def ping(self) -> None:
        """One round trip to the database; :class:`StoreUnavailableError` if it fails."""
        await self._in_transaction(_select_one)

    async def ready(self, now: float, limit: int) -> list[str]:
        return await self._read(pg_queries.ready, self.schema, now, limit)

    async def deliveries(self, owner: str) -> list[tuple[str, Answer]]:
        return await self._read(pg_queries.deliveries, self.schema, owner)

    async def delivered(self, request_ids: list[str]) -> None:
        await self._written(self._ops.delivered, list(request_ids))

    async def requests(self, now: float | None = None) -> list[Request]:
        return [stored.request for stored in await self.outstanding(now)]

    async def outstanding(self, now: float | None = None) -> list[StoredRequest]:
        at = time.time() if now is None else now
        return await self._read(pg_queries.outstanding, self.schema, at)

    async def find(self, request_id: str) -> StoredRequest:
        return await self._read(pg_queries.find, self.schema, request_id)

    async def load(self, run_id: str) -> StoredRun:
        return await self._read(pg_queries.load, self.schema, run_id)

    async def runs(self, limit: int = 1000) -> list[RunSummary]:
        return await self._read(pg_queries.runs, self.schema, limit)

    async def list_runs(self, query: RunQuery) -> RunPage:
        return await self._read(pg_queries.list_runs, self.schema, query, time.time())

    async def list_requests(self, query: RequestQuery) -> RequestPage:
        return await self._read(pg_queries.list_requests, self.schema, query, time.time())

    async def answers(self, run_id: str) -> list[AnswerRecord]:
        return await self._read(pg_queries.answers, self.schema, run_id)

    async def run_view(self, run_id: str) -> RunView:
        return await self._read(pg_queries.view, self.schema, run_id, time.time())

    async def events(self, after: int, limit: int = 500) -> EventRead:
        await self._pg.keep_listening()
        return await self._read(pg_queries.events, self.schema, after, limit)

    async def event_bounds(self) -> tuple[int, int]:
        return await self._read(pg_queries.event_bounds, self.schema)

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """``callback()`` after each write of this store object, and on each event told by
        another worker on the database (while a :meth:`listen` is open)."""
        return self._pg.watch(callback)

    # -- being told ------------------------------------------------------------------------

    async def listen(
        self, callback: Callable[[StoreEvent], None], *, owner: str | None = None
    ) -> Callable[[], None]:
        """Events committed by any worker on the database (through LISTEN/NOTIFY); with
        ``owner``, only the answers other workers took for runs ``owner`` holds, on that
        worker's own channel: a hundred workers do not each hear every run's events."""
        channel = CHANNEL if owner is None else owner_channel(owner)
        return await self._pg.listen(callback, channel)
