"""What every run store operation on SQLite shares: the connection, the transaction's state
(the leases it extended, whether a run ended in it), the owner-checked write and the
housekeeping a transaction does once before it commits.

Rules of the operations (``_run_ops``: a run's progress; ``_answer_ops``: answers and
leases; ``_ops.Ops``: both, what the batch calls):

- Every operation runs inside a transaction its caller began (``_batch`` puts many of
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
  (:meth:`OpsBase.prune`), not once per ended run; so are the oldest events.
- **An event is written with its change** (``_run_events``): each write that changes what
  a person sees of a run inserts its event rows after its own first write, in the same
  transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from ..._core.errors import UnknownRequestError
from .._run_events import EVENTS_KEEP, EventRow
from .._store import LeaseLostError
from ._schema import ENDED

__all__ = ("HELD", "OpsBase")

HELD = "run_id = ? AND owner = ? AND status = 'running'"


class OpsBase:
    """One connection inside its caller's transaction, and what that transaction did."""

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
