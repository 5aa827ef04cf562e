"""Answers and leases on PostgreSQL, each write over a connection in its caller's
transaction: an answer taken (or refused, with its audit row), a run claimed by a worker
(or failed, once, when it cannot be read back), a lease given or renewed, answers marked
handed over (the rules: ``_ops_base``)."""

from __future__ import annotations

from typing import Any

from ..._core.errors import DamagedRunError, StoreError
from ..._core.wire import ApprovalClaim, claim_refusal
from .._answers import refused_row, taken_row
from .._decide import accepted, damaged_reason, judge
from .._run_events import answered, failed
from .._store import Accepted, StoredRun
from ._ops_base import PgOpsBase
from ._ops_base import count as _count
from ._queries import load

__all__ = ("PgAnswerOps",)


class PgAnswerOps(PgOpsBase):
    """The writes of answers and of workers' leases."""

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
