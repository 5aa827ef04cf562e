"""The one order every transaction of the PostgreSQL store locks requests in.

Rules of this module:

- A transaction that locks several requests locks them all at once, in the order of
  their ids (``ORDER BY request_id FOR UPDATE``, one statement), and locks no other
  request after. Two transactions then never each hold a request the other waits for. A
  batch of answers does it in its first statement (``_grouped``); a batch of run writes,
  here (:class:`RequestsFirst`), before its writes: its turns and ends close requests, a
  claim or ``delivered`` marks answers handed over, a save replaces them, and one batch
  holds several such statements. Without it, a run batch holding one request and waiting
  for another that an answer batch held (late duplicate answers to two runs of one
  worker) was a deadlock, which PostgreSQL breaks after ``deadlock_timeout`` (1 s).
- A turn, an end, a failure or ``delivered`` alone in its batch (a run that shares no
  transaction) is not preceded so: its one statement that touches requests locks them
  in id order itself (a sub-select ``ORDER BY request_id FOR UPDATE``, ``_statements``,
  ``PgOps``), which spares that run a round trip per such write.
- What is locked here is what the writes could touch, or more: the pending or not yet
  delivered requests of every run a write closes or claims (a request leaves that set
  for good once it does), all of a saved run's, and the undelivered of those
  ``delivered`` names. A run's new requests are its own writes', inserted later in the
  same batch (no one else can hold them).
- Runs, workers and results are locked after, by the writes themselves; answers lock
  none of them, so they cannot close a circle with requests.
- Pruning ended runs locks their requests without waiting (``SKIP LOCKED``): it is the
  last thing a batch does, after the requests locked here, so it may not wait for one;
  a run with a request locked elsewhere (a late answer to it, being refused) is left for
  the next pruning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ("First", "RequestsFirst", "prunable")

# Locks what a batch's writes will touch, before them: ``first(conn, [(op, args), ...])``.
First = Callable[[Any, Sequence[tuple[Any, tuple[Any, ...]]]], Awaitable[None]]


class RequestsFirst:
    """The requests a batch of run writes on schema ``s`` will touch, locked in id order
    (the ops are ``PgOps``'s)."""

    def __init__(self, s: str, ops: Any, also_turns: Sequence[Any] = ()) -> None:
        """``also_turns``: other ops whose arguments begin as ``ops.turn``'s, and that
        close what it closes (a request written with its turn, ``_asked``)."""
        turns = (ops.turn, *also_turns)
        # The run whose open requests each op closes or marks delivered (None: none).
        self._closes: dict[Any, Callable[[tuple[Any, ...]], str | None]] = {
            ops.finish: lambda a: a[0],
            ops.fail: lambda a: a[0],
            ops.claim: lambda a: a[0],
        }
        for turn in turns:
            self._closes[turn] = lambda a: a[0] if a[1] > 1 else None  # turn 1 closes nothing
        self._delivered = ops.delivered
        self._save = ops.save
        # Alone in its batch, each of these locks its requests in one statement, in id
        # order itself: no round trip more for a run that shares no transaction.
        self._ordered = {*turns, ops.finish, ops.fail, ops.delivered}
        self._lock = (
            f"SELECT 1 FROM {s}.requests WHERE (run_id = ANY($1)"
            " AND (status = 'pending' OR delivered = 0)) OR run_id = ANY($2)"
            " OR (request_id = ANY($3) AND delivered = 0) ORDER BY request_id FOR UPDATE"
        )

    async def __call__(self, conn: Any, writes: Sequence[tuple[Any, tuple[Any, ...]]]) -> None:
        if len(writes) == 1 and writes[0][0] in self._ordered:
            return
        closed: list[str] = []
        saved: list[str] = []
        named: list[str] = []
        for op, args in writes:
            if op == self._delivered:
                named.extend(args[0])
            elif op == self._save:
                saved.append(args[0].run_id)
            else:
                closes = self._closes.get(op)
                run = None if closes is None else closes(args)
                if run is not None:
                    closed.append(run)
        if closed or saved or named:  # a round trip only when a write touches requests
            await conn.execute(self._lock, closed, saved, named)


async def prunable(conn: Any, s: str, runs: list[str]) -> list[str]:
    """Those of ``runs`` whose every request this transaction now holds (locked without
    waiting); the others are let be."""
    held = await conn.fetch(
        f"SELECT run_id FROM {s}.requests WHERE run_id = ANY($1) FOR UPDATE SKIP LOCKED", runs
    )
    counts = await conn.fetch(
        f"SELECT run_id, count(*) FROM {s}.requests WHERE run_id = ANY($1) GROUP BY run_id", runs
    )
    mine = Counter(row[0] for row in held)
    busy = {row[0] for row in counts if row[1] > mine[row[0]]}
    return [run for run in runs if run not in busy]
