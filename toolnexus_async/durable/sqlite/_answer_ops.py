"""Answers and leases on SQLite, as operations inside the caller's transaction: an answer
taken (or refused, with its audit row), a run claimed by a worker (or failed, once, when
it cannot be read back), a lease renewed, answers marked handed over (the rules:
``_ops_base``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..._core.errors import DamagedRunError, StoreError
from ..._core.wire import ApprovalClaim, claim_refusal
from .._answers import INSERT, refused_row, taken_row
from .._decide import accepted, damaged_reason, judge
from .._run_events import answered, failed
from .._store import Accepted, StoredRun
from ._ops_base import OpsBase
from ._queries import load
from ._schema import OPEN

__all__ = ("AnswerOps",)

_INSERT_ANSWER = INSERT.format(s="")


class AnswerOps(OpsBase):
    """The writes of answers and of workers' leases."""

    __slots__ = ()

    def accept(
        self,
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
        row = self._one(
            "SELECT q.body, q.run_id, q.call_id, q.status, q.expires_at, r.owner,"
            " w.alive_until, r.status, q.turn = r.turn FROM requests q"
            " JOIN runs r USING (run_id) LEFT JOIN workers w ON w.name = r.owner"
            " WHERE q.request_id = ?",
            (answer_id,),
        )
        refusal, expire = judge(answer_id, row, now)
        if expire:  # marked, so that its run (if nobody holds it) goes on with the expiry
            self.conn.execute(
                "UPDATE requests SET status = 'expired', delivered = 0"
                " WHERE request_id = ? AND status = 'pending'",
                (answer_id,),
            )
            self._tell([answered(row[1], False, "expired", answer_id, now, None)], now)
        if refusal is not None:
            return self._refused(row, refusal, answered_by, by, now)
        taken = accepted(row)  # before the write: a damaged row is refused, changing nothing
        mismatch = claim_refusal(taken.request, claim)
        if mismatch is not None:
            # It approves another call: nothing taken, the request waits.
            return self._refused(row, mismatch, answered_by, by, now)
        self.conn.execute(
            "UPDATE requests SET status = 'answered', answer = ?, delivered = ?,"
            " answered_at = ?, answered_by = ? WHERE request_id = ? AND status = 'pending'",
            (answer, int(delivered), now, by, answer_id),
        )
        event = answered(taken.run_id, ok, reason, answer_id, now, by, answered_by)
        self._tell([event], now)
        record = taken_row(
            taken.request, taken.run_id, taken.call_id, ok, reason, answered_by, by, now
        )
        self.conn.execute(_INSERT_ANSWER, record)
        return taken

    def _refused(
        self,
        row: Any,
        refusal: Exception,
        answered_by: str | None,
        worker: str | None,
        now: float,
    ) -> Exception:
        """Record a refused answer (``_answers``) and hand its refusal back."""
        record = refused_row(row, refusal, answered_by, worker, now)
        if record is not None:
            self.conn.execute(_INSERT_ANSWER, record)
        return refusal

    def claim(
        self, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | DamagedRunError | None:
        changed = self.conn.execute(
            "UPDATE runs SET status = 'running', owner = ?, updated = ?"
            f" WHERE run_id = ? AND status IN {OPEN} AND (owner IS NULL OR owner = ?"
            "  OR owner IN (SELECT name FROM workers WHERE alive_until < ?))",
            (owner, now, run_id, owner, now),
        ).rowcount
        if not changed:
            return None
        self._alive(owner, lease_until)
        # The claimer has every outcome from here on (it loads them below).
        self.conn.execute(
            "UPDATE requests SET delivered = 1 WHERE run_id = ? AND delivered = 0", (run_id,)
        )
        expired = [
            answered(run_id, False, "expired", request_id, now, None)
            for (request_id,) in self.conn.execute(
                "SELECT request_id FROM requests"
                " WHERE run_id = ? AND status = 'pending' AND expires_at <= ?",
                (run_id, now),
            )
        ]
        if expired:
            self.conn.execute(
                "UPDATE requests SET status = 'expired', delivered = 1"
                " WHERE run_id = ? AND status = 'pending' AND expires_at <= ?",
                (run_id, now),
            )
            self._tell(expired, now)
        try:
            return load(self.conn, run_id)
        except StoreError as exc:
            return self._damaged(run_id, exc, now)

    def _damaged(self, run_id: str, exc: StoreError, now: float) -> DamagedRunError:
        """A claimed run that cannot be read back is failed with the reason, once: it is
        never ready again, so nobody tries it every sweep."""
        error = damaged_reason(exc)
        self.conn.execute(
            "UPDATE runs SET status = 'failed', owner = NULL, error = ?, updated = ?"
            " WHERE run_id = ?",
            (error, now, run_id),
        )
        self._close_requests(run_id)
        self.ended = True
        self._tell([failed(run_id, error)], now)
        return DamagedRunError(run_id, f"run {run_id!r} {error}")

    def renew(self, owner: str, lease_until: float) -> None:
        self._alive(owner, lease_until)

    def delivered(self, request_ids: Iterable[str]) -> None:
        self.conn.executemany(
            "UPDATE requests SET delivered = 1 WHERE request_id = ? AND delivered = 0",
            [(request_id,) for request_id in request_ids],
        )
