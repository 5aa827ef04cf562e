"""Each run store operation as one synchronous function over an open SQLite connection.

Rules of this module:

- Every operation runs inside a transaction its caller began (``_sqlite`` puts many of
  them into one commit); none commits, sleeps or awaits.
- **Check, then write.** An operation that refuses by raising has written nothing, so that
  a refused write needs no savepoint to undo it (savepoints would double the cost of every
  write). A refusal that must keep what it changed (an answer to an expired request marks
  the request expired) is *returned* as an exception instance instead.
- Ownership is checked in the same statement that writes (``... AND owner = ?``): a worker
  that lost its lease cannot write over the worker that holds the run now. Only when such
  a guarded write changed nothing is the run read, to say why.
- A worker's lease is one row of ``workers``: holding a run is naming its owner, and the
  run is held while its owner's lease runs. Extending a lease never shortens it.
- Ended runs beyond the retention bound are pruned once per transaction
  (:meth:`Ops.prune`), not once per ended run; so are the oldest events.
- **An event is written with its change** (``_run_events``): each write that changes what
  a person sees of a run inserts its event rows after its own first write, in the same
  transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from ..._core.errors import (
    DamagedRunError,
    PayloadError,
    StoreError,
    UnknownRequestError,
    UsageError,
)
from ..._core.results import RunResult
from ..._core.wire import ApprovalClaim, claim_refusal
from .._answers import INSERT, refused_row, taken_row
from .._decide import Saved, accepted, damaged_reason, judge, saved
from .._run_events import EVENTS_KEEP, EventRow, answered, failed
from .._store import Accepted, LeaseLostError, StoredRun
from ._queries import load
from ._schema import ENDED, OPEN, SCHEMA_VERSION, UPGRADE_2, UPGRADE_3, UPGRADE_4, UPGRADE_5, create

__all__ = ("Ops", "migrate")

_HELD = "run_id = ? AND owner = ? AND status = 'running'"
_INSERT_ANSWER = INSERT.format(s="")


class Ops:
    """The operations of a run store, on one connection, inside its caller's transaction."""

    __slots__ = ("_leases", "conn", "ended")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.ended = False  # a run ended in this transaction: prune before committing
        # Leases extended in this transaction, (as written, latest asked): a batch of one
        # worker's writes extends its lease at its first write and once more at the end,
        # not once per write.
        self._leases: dict[str, tuple[float, float]] = {}

    def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        return self.conn.execute(sql, tuple(params)).fetchone()

    def _lost(self, run_id: str, owner: str) -> Exception:
        """Why a write guarded by ``owner`` changed nothing."""
        row = self._one("SELECT owner, status FROM runs WHERE run_id = ?", (run_id,))
        if row is None:
            return UnknownRequestError(run_id, f"no stored run {run_id!r}")
        return LeaseLostError(
            f"run {run_id!r} is not held by this worker any more (held by {row[0]!r}, "
            f"{row[1]}); it must stop here"
        )

    def _guarded(self, sql: str, params: tuple[Any, ...], run_id: str, owner: str) -> None:
        if not self.conn.execute(sql, params).rowcount:
            raise self._lost(run_id, owner)

    def _alive(self, owner: str, until: float) -> None:
        written = self._leases.get(owner)
        if written is None:
            self._extend(owner, until)
            self._leases[owner] = (until, until)
        elif until > written[1]:
            self._leases[owner] = (written[0], until)  # written by :meth:`finish_batch`

    def _extend(self, owner: str, until: float) -> None:
        self.conn.execute(
            "INSERT INTO workers (name, alive_until) VALUES (?, ?) ON CONFLICT (name)"
            " DO UPDATE SET alive_until = max(alive_until, excluded.alive_until)",
            (owner, until),
        )

    def finish_batch(self, keep: int) -> None:
        """What a transaction does once, before it commits: the leases its writes
        extended, at their latest, and the pruning of ended runs and old events."""
        for owner, (written, until) in self._leases.items():
            if until > written:
                self._extend(owner, until)
        if self.ended:
            self.prune(keep)
            self.conn.execute(
                "DELETE FROM events WHERE seq <= (SELECT max(seq) FROM events) - ?",
                (EVENTS_KEEP,),
            )

    def _tell(self, rows: list[EventRow], now: float) -> None:
        """The events of this write (after its own first write: see ``_run_events``)."""
        self.conn.executemany(
            "INSERT INTO events (run_id, kind, data, at) VALUES (?, ?, ?, ?)",
            [(*row, now) for row in rows],
        )

    def _close_requests(self, run_id: str, before_turn: int | None = None) -> None:
        """The run went on past these requests: pending ones are closed, and none is
        waiting to be handed over any more."""
        turn = "" if before_turn is None else f" AND turn < {int(before_turn)}"
        self.conn.execute(
            "UPDATE requests SET status = CASE status WHEN 'pending' THEN 'closed'"
            " ELSE status END, delivered = 1"
            f" WHERE run_id = ?{turn} AND (status = 'pending' OR delivered = 0)",
            (run_id,),
        )

    # -- a run's progress -----------------------------------------------------------------

    def start(
        self,
        run_id: str,
        owner: str,
        lease_until: float,
        turn: int,
        state: str,
        prompt: str,
        now: float,
        events: list[EventRow],
    ) -> None:
        try:
            self.conn.execute(
                "INSERT INTO runs (run_id, status, owner, turn, state, prompt, created,"
                " updated) VALUES (?, 'running', ?, ?, ?, ?, ?, ?)",
                (run_id, owner, turn, state, prompt, now, now),
            )
        except sqlite3.IntegrityError:
            raise UsageError(
                f"a run {run_id!r} is stored already; run ids must be unique"
            ) from None
        self._alive(owner, lease_until)
        self._tell(events, now)

    def turn(
        self, run_id: str, turn: int, owner: str, state: str, now: float, events: list[EventRow]
    ) -> None:
        self._guarded(
            f"UPDATE runs SET turn = ?, state = ?, updated = ? WHERE {_HELD}",
            (turn, state, now, run_id, owner),
            run_id,
            owner,
        )
        if turn > 1:  # the earlier turn's results and requests are in the state now
            self.conn.execute("DELETE FROM results WHERE run_id = ?", (run_id,))
            self._close_requests(run_id, before_turn=turn)
        self._tell(events, now)

    def record(
        self,
        run_id: str,
        call_id: str,
        owner: str,
        record: str,
        event: EventRow,
        request_id: str | None,
        now: float,
    ) -> None:
        """``request_id``: the call's request, if it may have expired where its run was
        parked (then ``answered`` is told, unless the store took an answer to it)."""
        self._guarded(
            "INSERT OR REPLACE INTO results (run_id, call_id, record)"
            f" SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM runs WHERE {_HELD})",
            (run_id, call_id, record, run_id, owner),
            run_id,
            owner,
        )
        rows = [event]
        if request_id is not None and self._one(
            "SELECT 1 FROM requests WHERE request_id = ? AND status = 'pending'", (request_id,)
        ):
            rows.insert(0, answered(run_id, False, "expired", request_id, now, None))
        self._tell(rows, now)

    def suspend(
        self,
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
        try:
            self._guarded(
                "INSERT INTO requests (request_id, run_id, call_id, turn, body, status,"
                " expires_at, kind, prompt, raised_at)"
                f" SELECT ?, run_id, ?, turn, ?, 'pending', ?, ?, ?, ? FROM runs WHERE {_HELD}",
                (request_id, call_id, body, expires_at, kind, prompt, now, run_id, owner),
                run_id,
                owner,
            )
        except sqlite3.IntegrityError:
            raise UsageError(
                f"request id {request_id!r} is stored already; ids must be unique"
            ) from None
        self._tell([event], now)

    def halt(self, run_id: str, owner: str, now: float) -> None:
        self._guarded(
            f"UPDATE runs SET status = 'halted', owner = NULL, updated = ? WHERE {_HELD}",
            (now, run_id, owner),
            run_id,
            owner,
        )

    def release(self, run_id: str, owner: str, now: float) -> None:
        self.conn.execute(
            "UPDATE runs SET owner = NULL, updated = ? WHERE run_id = ? AND owner = ?",
            (now, run_id, owner),
        )

    def finish(
        self,
        run_id: str,
        owner: str,
        final: str,
        now: float,
        outcome: str,
        text: str | None,
        event: EventRow,
    ) -> None:
        self._guarded(
            "UPDATE runs SET status = 'done', owner = NULL, final = ?, updated = ?,"
            f" outcome = ?, text = ? WHERE {_HELD}",
            (final, now, outcome, text, run_id, owner),
            run_id,
            owner,
        )
        self.conn.execute("DELETE FROM results WHERE run_id = ?", (run_id,))
        self._close_requests(run_id)
        self.ended = True
        self._tell([event], now)

    def fail(self, run_id: str, error: str, owner: str, now: float) -> None:
        self._guarded(
            "UPDATE runs SET status = 'failed', owner = NULL, error = ?, updated = ?"
            f" WHERE {_HELD}",
            (error, now, run_id, owner),
            run_id,
            owner,
        )
        self._close_requests(run_id)
        self.ended = True
        self._tell([failed(run_id, error)], now)

    def prune(self, keep: int) -> None:
        """Forget the oldest ended runs beyond ``keep`` (their requests go with them)."""
        old = [
            (run_id,)
            for (run_id,) in self.conn.execute(
                f"SELECT run_id FROM runs WHERE status IN {ENDED}"
                " ORDER BY updated DESC LIMIT -1 OFFSET ?",
                (keep,),
            )
        ]
        for table in ("requests", "results", "runs"):
            self.conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", old)
        # Workers gone for a day that hold nothing are forgotten too.
        self.conn.execute(
            "DELETE FROM workers WHERE alive_until < ? AND NOT EXISTS"
            " (SELECT 1 FROM runs WHERE owner = workers.name)",
            (time.time() - 86_400,),
        )

    def save(self, saved: Saved, now: float, events: list[EventRow]) -> None:
        """A run halted elsewhere (see :func:`saved`), held by nobody."""
        run_id = saved.run_id
        for request_id, _, _, _ in saved.requests:
            owner = self._one("SELECT run_id FROM requests WHERE request_id = ?", (request_id,))
            if owner is not None and owner[0] != run_id:
                raise UsageError(f"request {request_id!r} is already filed under run {owner[0]!r}")
        for table in ("requests", "results", "runs"):
            self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        self.conn.execute(
            "INSERT INTO runs (run_id, status, owner, turn, state, prompt, created, updated)"
            " VALUES (?, 'halted', NULL, ?, ?, ?, ?, ?)",
            (run_id, saved.turn, saved.state, saved.prompt, now, now),
        )
        self.conn.executemany(
            "INSERT INTO results (run_id, call_id, record) VALUES (?, ?, ?)",
            [(run_id, call_id, record) for call_id, record in saved.results],
        )
        self.conn.executemany(
            "INSERT INTO requests (request_id, run_id, call_id, turn, body, status,"
            " expires_at, kind, prompt) VALUES (?, ?, ?, ?, ?, 'pending', ?,"
            " json_extract(?, '$.kind'), json_extract(?, '$.prompt'))",
            # Plain question marks only, the body given again for each json_extract: sqlite3
            # refuses numbered placeholders beside a sequence from Python 3.14 (3.12 warns).
            [
                (rid, run_id, cid, saved.turn, body, exp, body, body)
                for rid, cid, body, exp in saved.requests
            ],
        )
        self._tell(events, now)

    # -- answers and leases ---------------------------------------------------------------

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

    def set_mcp_token(self, key: str, value: str | None, now: float) -> None:
        if value is None:
            self.conn.execute("DELETE FROM mcp_tokens WHERE key = ?", (key,))
        else:
            self.conn.execute(
                "INSERT INTO mcp_tokens (key, value, updated) VALUES (?, ?, ?) ON CONFLICT(key)"
                " DO UPDATE SET value = excluded.value, updated = excluded.updated",
                (key, value, now),
            )

    def delivered(self, request_ids: Iterable[str]) -> None:
        self.conn.executemany(
            "UPDATE requests SET delivered = 1 WHERE request_id = ? AND delivered = 0",
            [(request_id,) for request_id in request_ids],
        )


# Version n to n + 1, for each n from 2 on.
_UPGRADES = {2: UPGRADE_2, 3: UPGRADE_3, 4: UPGRADE_4, 5: UPGRADE_5}


def migrate(conn: sqlite3.Connection, version: int, path: str) -> None:
    """Bring a file of an earlier schema to the current one, in the caller's transaction:
    one version at a time from 2 on; a version 1 file is rebuilt at the current one."""
    if version in _UPGRADES:
        for step in range(version, SCHEMA_VERSION):
            for statement in _UPGRADES[step]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    if version != 1:
        raise StoreError(f"run store {path} has schema version {version}, which is unknown")
    old = conn.execute("SELECT body FROM runs ORDER BY seq").fetchall()
    for table in ("runs", "requests", "claimed"):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    create(conn)
    ops = Ops(conn)
    for (body,) in old:
        try:
            ops.save(saved(RunResult.from_dict(body)), 0.0, [])
        except (PayloadError, UsageError) as exc:
            raise StoreError(
                f"run store {path}: a version 1 run cannot be migrated: {exc}"
            ) from None
