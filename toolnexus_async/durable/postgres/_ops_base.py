"""What every run store operation on PostgreSQL shares: the schema, its single-statement
writes (``_statements``), the owner-checked write, the events' insert, the closing of a
run's requests, and the pruning a store does now and then.

Rules of the operations (``_run_ops``: a run's progress; ``_answer_ops``: answers and
leases; ``_ops.PgOps``: both, what the store and the group commit call):

- One method per write, each over a connection inside a transaction its caller opened;
  the statements are those of the SQLite store (the same tables, the same guards), and the
  rows become values through the same functions (``_decide.judge``; the reads,
  ``_queries``, through ``_queries.run_of``), so the two stores keep one contract.
- Ownership is checked in the statement that writes (``... AND owner = $n``), and a row a
  write depends on is locked by that statement, so two workers racing for one request or
  one run are serialised by PostgreSQL: exactly one wins, the other sees its result.
- The operations notify nobody themselves: the group commit (``_committer``) sends the
  events of a batch's writes (``_ops.routes``, ``_ops.event_body``) in the transaction
  that wrote them, one statement for them all.
- A write's events (``_run_events``) are inserted after its own first write, so that its
  transaction has its id before it takes an event ``seq`` (what ``EventTail`` relies on).
"""

from __future__ import annotations

from typing import Any

from ..._core.errors import UnknownRequestError
from .._answers import INSERT
from .._listing import numbered
from .._run_events import EVENTS_KEEP, EventRow
from .._store import LeaseLostError
from ._order import prunable
from ._statements import Statements

__all__ = ("HELD", "PgOpsBase", "count")

HELD = "run_id = $1 AND owner = $2 AND status = 'running'"


def count(status: str) -> int:
    """The row count of an asyncpg command status such as ``UPDATE 1``."""
    return int(status.rsplit(" ", 1)[-1])


class PgOpsBase:
    """The tables of one PostgreSQL schema, and what every operation on them uses."""

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
        if not count(await conn.execute(sql, run_id, owner, *args)):
            raise await self._lost(conn, run_id, owner)

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
