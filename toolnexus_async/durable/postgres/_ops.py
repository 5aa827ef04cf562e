"""The run store's operations in PostgreSQL: the SQLite store's, in another dialect.

Rules of this module:

- One method per write, each over a connection inside a transaction its caller opened;
  the statements are those of ``_ops`` (the same tables, the same guards), and the rows
  become values through the same functions (``_decide.judge``; the reads, ``_pg_queries``,
  through ``_queries.run_of``), so the two stores keep one contract.
- Ownership is checked in the statement that writes (``... AND owner = $n``), and a row a
  write depends on is locked by that statement, so two workers racing for one request or
  one run are serialised by PostgreSQL: exactly one wins, the other sees its result.
- The operations notify nobody themselves: the group commit (``_committer``) sends the
  events of a batch's writes (:func:`routes`, :func:`event_body`) in the transaction
  that wrote them, one statement for them all.
- A write's events (``_run_events``) are inserted after its own first write, so that its
  transaction has its id before it takes an event ``seq`` (what ``EventTail`` relies on).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..._core.errors import DamagedRunError, StoreError, UnknownRequestError, UsageError
from ..._core.wire import ApprovalClaim, claim_refusal
from .._answers import INSERT, refused_row, taken_row
from .._decide import Saved, accepted, damaged_reason, judge
from .._listing import numbered
from .._run_events import EVENTS_KEEP, EventRow, answered, failed
from .._store import Accepted, LeaseLostError, StoredRun, StoreEvent
from ._order import prunable
from ._queries import load
from ._statements import Statements

__all__ = ("CHANNEL", "LISTENING_LOCK", "PgOps", "event_body", "owner_channel", "routes")

# The channel every store on a database announces every event on, for whoever wants them
# all (``listen()`` with no owner): one notification per transaction, whatever it holds,
# and only while some session listens on it. PostgreSQL (15) wakes every listening
# session of the database at each commit that notifies, whatever the channel; so a
# notification nobody wants would still cost the server a wake-up per listening worker.
CHANNEL = "toolnexus_run_store"

# The session-level advisory lock (shared) a connection LISTENing on CHANNEL holds: how a
# writer sees that someone listens there (``pg_locks``), gone with that connection.
LISTENING_LOCK = 0x546E7841_0002


def owner_channel(owner: str) -> str:
    """The channel of the worker ``owner``: the answers another worker took for the runs
    it holds, told to it alone (a channel name is an identifier of at most 63 bytes)."""
    return "toolnexus_w_" + hashlib.blake2b(owner.encode(), digest_size=12).hexdigest()


def routes(event: StoreEvent, by: str | None = None) -> tuple[str, ...]:
    """The channels ``event`` goes to: every event to :data:`CHANNEL`; an answer taken
    by another worker than ``by`` (the one that took it) and not handed over, also to its
    run's owner, who must wake the run."""
    owner = event.owner
    if event.kind == "answered" and owner is not None and not event.delivered and owner != by:
        return (CHANNEL, owner_channel(owner))
    return (CHANNEL,)


def event_body(event: StoreEvent) -> dict[str, str | bool | None]:
    """What a NOTIFY says of ``event``: the ids it names, never data."""
    body: dict[str, str | bool | None] = {
        "kind": event.kind,
        "request": event.request_id,
        "run": event.run_id,
        "owner": event.owner,
    }
    if event.delivered:
        body["delivered"] = True
    return body


def _arrays(rows: list[EventRow]) -> tuple[list[str], list[str], list[str]]:
    """Events as the three arrays a statement of ``_statements`` inserts them from."""
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


_HELD = "run_id = $1 AND owner = $2 AND status = 'running'"


def _count(status: str) -> int:
    """The row count of an asyncpg command status such as ``UPDATE 1``."""
    return int(status.rsplit(" ", 1)[-1])


class PgOps:
    """The operations on the tables of one PostgreSQL schema."""

    def __init__(self, schema: str) -> None:
        self.s = schema
        self._insert_answer = numbered(INSERT.format(s=f"{schema}."))
        self._one = Statements(schema)

    async def _lost(self, conn: Any, run_id: str, owner: str) -> Exception:
        row = await conn.fetchrow(
            f"SELECT owner, status FROM {self.s}.runs WHERE run_id = $1", run_id
        )
        if row is None:
            return UnknownRequestError(run_id, f"no stored run {run_id!r}")
        return LeaseLostError(
            f"run {run_id!r} is not held by this worker any more (held by {row[0]!r}, "
            f"{row[1]}); it must stop here"
        )

    async def _guarded(self, conn: Any, sql: str, run_id: str, owner: str, *args: Any) -> None:
        if not _count(await conn.execute(sql, run_id, owner, *args)):
            raise await self._lost(conn, run_id, owner)

    async def _alive(self, conn: Any, owner: str, until: float) -> None:
        """Extend ``owner``'s lease to ``until`` (renewal: always)."""
        await conn.execute(
            f"INSERT INTO {self.s}.workers (name, alive_until) VALUES ($1, $2)"
            " ON CONFLICT (name) DO UPDATE SET alive_until ="
            f" GREATEST({self.s}.workers.alive_until, excluded.alive_until)",
            owner,
            until,
        )

    async def _known(self, conn: Any, owner: str, until: float, now: float) -> None:
        """Give ``owner`` a lease if it has none that still runs at ``now``.

        A run started or claimed by a worker whose lease runs is covered by that lease,
        which its host renews; writing the row for every run would make all of one
        worker's transactions wait on that row's lock, one after the other.
        """
        await conn.execute(
            f"INSERT INTO {self.s}.workers (name, alive_until) SELECT $1, $2 WHERE NOT EXISTS"
            f" (SELECT 1 FROM {self.s}.workers WHERE name = $1 AND alive_until >= $3)"
            " ON CONFLICT (name) DO UPDATE SET alive_until ="
            f" GREATEST({self.s}.workers.alive_until, excluded.alive_until)",
            owner,
            until,
            now,
        )

    async def _tell(self, conn: Any, rows: list[EventRow], now: float) -> None:
        """The events of this write, after its first write (see the module rules)."""
        insert = f"INSERT INTO {self.s}.events (run_id, kind, data, at) VALUES ($1, $2, $3, $4)"
        if len(rows) == 1:
            await conn.execute(insert, *rows[0], now)
        elif rows:
            await conn.executemany(insert, [(*row, now) for row in rows])

    async def _close_requests(self, conn: Any, run_id: str) -> None:
        await conn.execute(  # in the order of their ids, as every lock of requests (_order)
            f"UPDATE {self.s}.requests SET status = CASE status WHEN 'pending' THEN 'closed'"
            f" ELSE status END, delivered = 1 WHERE request_id IN (SELECT request_id FROM"
            f" {self.s}.requests WHERE run_id = $1 AND (status = 'pending' OR delivered = 0)"
            " ORDER BY request_id FOR UPDATE)",
            run_id,
        )

    # -- a run's progress -----------------------------------------------------------------

    async def start(
        self,
        conn: Any,
        run_id: str,
        owner: str,
        lease_until: float,
        turn: int,
        state: str,
        prompt: str,
        now: float,
        events: list[EventRow],
    ) -> None:
        inserted = await conn.fetchval(
            self._one.start, run_id, owner, turn, state, prompt, now, lease_until, *_arrays(events)
        )
        if not inserted:
            raise UsageError(f"a run {run_id!r} is stored already; run ids must be unique")

    async def turn(
        self,
        conn: Any,
        run_id: str,
        turn: int,
        owner: str,
        state: str,
        now: float,
        events: list[EventRow],
    ) -> None:
        if not await conn.fetchval(
            self._one.turn, run_id, owner, turn, state, now, *_arrays(events)
        ):
            raise await self._lost(conn, run_id, owner)

    async def record(
        self,
        conn: Any,
        run_id: str,
        call_id: str,
        owner: str,
        record: str,
        event: EventRow,
        request_id: str | None,
        now: float,
    ) -> None:
        rows = [event]
        if request_id is not None:  # written only if that request is still pending
            rows.insert(0, answered(run_id, False, "expired", request_id, now, None))
        if not await conn.fetchval(
            self._one.record, run_id, owner, call_id, record, request_id, *_arrays(rows), now
        ):
            raise await self._lost(conn, run_id, owner)

    async def suspend(
        self,
        conn: Any,
        run_id: str,
        call_id: str,
        owner: str,
        request_id: str,
        body: str,
        expires_at: float | None,
        kind: str,
        prompt: str,
        event: EventRow,
        now: float,
    ) -> None:
        inserted = await conn.fetchval(
            self._one.suspend,
            run_id,
            owner,
            request_id,
            call_id,
            body,
            expires_at,
            kind,
            prompt,
            *_arrays([event]),
            now,
        )
        if not inserted:
            if await conn.fetchval(
                f"SELECT 1 FROM {self.s}.requests WHERE request_id = $1", request_id
            ):
                raise UsageError(f"request id {request_id!r} is stored already; ids must be unique")
            raise await self._lost(conn, run_id, owner)

    async def halt(self, conn: Any, run_id: str, owner: str, now: float) -> None:
        await self._guarded(
            conn,
            f"UPDATE {self.s}.runs SET status = 'halted', owner = NULL, updated = $3 WHERE {_HELD}",
            run_id,
            owner,
            now,
        )

    async def release(self, conn: Any, run_id: str, owner: str, now: float) -> None:
        await conn.execute(
            f"UPDATE {self.s}.runs SET owner = NULL, updated = $3 WHERE run_id = $1 AND owner = $2",
            run_id,
            owner,
            now,
        )

    async def finish(
        self,
        conn: Any,
        run_id: str,
        owner: str,
        final: str,
        now: float,
        outcome: str,
        text: str | None,
        event: EventRow,
    ) -> None:
        if not await conn.fetchval(
            self._one.finish, run_id, owner, final, now, outcome, text, *_arrays([event])
        ):
            raise await self._lost(conn, run_id, owner)

    async def fail(self, conn: Any, run_id: str, error: str, owner: str, now: float) -> None:
        await self._guarded(
            conn,
            f"UPDATE {self.s}.runs SET status = 'failed', owner = NULL, error = $3, updated = $4"
            f" WHERE {_HELD}",
            run_id,
            owner,
            error,
            now,
        )
        await self._close_requests(conn, run_id)
        await self._tell(conn, [failed(run_id, error)], now)

    async def prune(self, conn: Any, keep: int, now: float) -> None:
        old = await conn.fetch(
            f"SELECT run_id FROM {self.s}.runs WHERE status IN ('done', 'failed')"
            " ORDER BY updated DESC OFFSET $1",
            keep,
        )
        ids = await prunable(conn, self.s, [row[0] for row in old]) if old else []
        if ids:
            for table in ("requests", "results", "runs"):
                await conn.execute(f"DELETE FROM {self.s}.{table} WHERE run_id = ANY($1)", ids)
        await conn.execute(
            f"DELETE FROM {self.s}.workers w WHERE alive_until < $1 AND NOT EXISTS"
            f" (SELECT 1 FROM {self.s}.runs r WHERE r.owner = w.name)",
            now - 86_400,
        )
        await conn.execute(
            f"DELETE FROM {self.s}.events WHERE seq <= (SELECT max(seq) FROM {self.s}.events) - $1",
            EVENTS_KEEP,
        )

    async def save(self, conn: Any, saved: Saved, now: float, events: list[EventRow]) -> None:
        """A run halted elsewhere (see ``_ops.saved``), held by nobody."""
        run_id = saved.run_id
        taken = await conn.fetchrow(
            f"SELECT request_id, run_id FROM {self.s}.requests"
            " WHERE request_id = ANY($1) AND run_id <> $2 LIMIT 1",
            [r[0] for r in saved.requests],
            run_id,
        )
        if taken is not None:
            raise UsageError(f"request {taken[0]!r} is already filed under run {taken[1]!r}")
        for table in ("requests", "results", "runs"):
            await conn.execute(f"DELETE FROM {self.s}.{table} WHERE run_id = $1", run_id)
        await conn.execute(
            f"INSERT INTO {self.s}.runs (run_id, status, owner, turn, state, prompt, created,"
            " updated) VALUES ($1, 'halted', NULL, $2, $3, $4, $5, $5)",
            run_id,
            saved.turn,
            saved.state,
            saved.prompt,
            now,
        )
        await conn.executemany(
            f"INSERT INTO {self.s}.results (run_id, call_id, record) VALUES ($1, $2, $3)",
            [(run_id, call_id, record) for call_id, record in saved.results],
        )
        await conn.executemany(
            f"INSERT INTO {self.s}.requests (request_id, run_id, call_id, turn, body, status,"
            " expires_at, kind, prompt) VALUES ($1, $2, $3, $4, $5, 'pending', $6,"
            " $5::text::json->>'kind', $5::text::json->>'prompt')",
            [(rid, run_id, cid, saved.turn, body, exp) for rid, cid, body, exp in saved.requests],
        )
        await self._tell(conn, events, now)

    # -- answers and leases ---------------------------------------------------------------

    async def accept(
        self,
        conn: Any,
        answer_id: str,
        answer: str,
        now: float,
        delivered: bool,
        claim: ApprovalClaim | None = None,
        ok: bool = True,
        reason: str | None = None,
        by: str | None = None,
        answered_by: str | None = None,
    ) -> Accepted | Exception:
        # FOR UPDATE OF q: a second answer to the same request waits here until the first
        # committed, then reads its outcome.
        row = await conn.fetchrow(
            "SELECT q.body, q.run_id, q.call_id, q.status, q.expires_at, r.owner,"
            " w.alive_until, r.status, q.turn = r.turn"
            f" FROM {self.s}.requests q JOIN {self.s}.runs r USING (run_id)"
            f" LEFT JOIN {self.s}.workers w ON w.name = r.owner"
            " WHERE q.request_id = $1 FOR UPDATE OF q",
            answer_id,
        )
        values = None if row is None else tuple(row)
        refusal, expire = judge(answer_id, values, now)
        if expire:
            await conn.execute(
                f"UPDATE {self.s}.requests SET status = 'expired', delivered = 0"
                " WHERE request_id = $1 AND status = 'pending'",
                answer_id,
            )
            assert values is not None  # judge marks an existing request only
            expiry = answered(values[1], False, "expired", answer_id, now, None)
            await self._tell(conn, [expiry], now)
        if refusal is not None:
            return await self._refused(conn, values, refusal, answered_by, by, now)
        assert values is not None
        taken = accepted(values)  # before the write: a damaged row is refused, changing nothing
        mismatch = claim_refusal(taken.request, claim)
        if mismatch is not None:
            # It approves another call: nothing taken, the request waits.
            return await self._refused(conn, values, mismatch, answered_by, by, now)
        event = answered(taken.run_id, ok, reason, answer_id, now, by, answered_by)
        record = taken_row(
            taken.request, taken.run_id, taken.call_id, ok, reason, answered_by, by, now
        )
        # The answer, its event and its audit row: one statement (``_statements``).
        await conn.fetchval(
            self._one.take, answer_id, answer, int(delivered), now, by, *event, *record
        )
        return taken

    async def _refused(
        self,
        conn: Any,
        values: tuple[Any, ...] | None,
        refusal: Exception,
        answered_by: str | None,
        worker: str | None,
        now: float,
    ) -> Exception:
        """Record a refused answer (``_answers``) and hand its refusal back."""
        record = refused_row(values, refusal, answered_by, worker, now)
        if record is not None:
            await conn.execute(self._insert_answer, *record)
        return refusal

    async def claim(
        self, conn: Any, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | DamagedRunError | None:
        changed = await conn.execute(
            f"UPDATE {self.s}.runs SET status = 'running', owner = $2, updated = $3"
            " WHERE run_id = $1 AND status IN ('running', 'halted') AND (owner IS NULL"
            f" OR owner = $2 OR owner IN (SELECT name FROM {self.s}.workers"
            " WHERE alive_until < $3))",
            run_id,
            owner,
            now,
        )
        if not _count(changed):
            return None
        await self._known(conn, owner, lease_until, now)
        await conn.execute(
            f"UPDATE {self.s}.requests SET delivered = 1 WHERE run_id = $1 AND delivered = 0",
            run_id,
        )
        expired = await conn.fetch(
            f"UPDATE {self.s}.requests SET status = 'expired', delivered = 1"
            " WHERE run_id = $1 AND status = 'pending' AND expires_at <= $2 RETURNING request_id",
            run_id,
            now,
        )
        await self._tell(
            conn, [answered(run_id, False, "expired", r[0], now, None) for r in expired], now
        )
        try:
            return await load(conn, self.s, run_id)
        except StoreError as exc:
            # As in ``_ops``: failed with the reason, once, and never ready again.
            error = damaged_reason(exc)
            await conn.execute(
                f"UPDATE {self.s}.runs SET status = 'failed', owner = NULL, error = $2,"
                " updated = $3 WHERE run_id = $1",
                run_id,
                error,
                now,
            )
            await self._close_requests(conn, run_id)
            await self._tell(conn, [failed(run_id, error)], now)
            return DamagedRunError(run_id, f"run {run_id!r} {error}")

    async def renew(self, conn: Any, owner: str, lease_until: float) -> None:
        await self._alive(conn, owner, lease_until)

    async def delivered(self, conn: Any, request_ids: list[str]) -> None:
        await conn.execute(  # in the order of their ids, as every lock of requests (_order)
            f"UPDATE {self.s}.requests SET delivered = 1 WHERE request_id IN (SELECT request_id"
            f" FROM {self.s}.requests WHERE request_id = ANY($1) AND delivered = 0"
            " ORDER BY request_id FOR UPDATE)",
            request_ids,
        )
