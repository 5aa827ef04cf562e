"""The hot writes of the PostgreSQL store, each one statement: one round trip, not four.

Rules of this module:

- A write that took several statements (its row, the worker's lease, its events, the rows
  it closes) is one statement here, its parts data-modifying ``WITH`` queries gated on the
  first (``EXISTS (SELECT 1 FROM <first>)``): when the first writes nothing (the run is
  not held, the row exists), nothing else is written and the caller sees a count of 0,
  as the separate statements did. A round trip costs the worker more CPU than the
  statement's work (issue 41), and a run makes about six writes.
- Its events (``_run_events``) are inserted from arrays, in their order (``WITH
  ORDINALITY ... ORDER BY``), by a query that reads the first part's rows: that part's
  row is written, so the transaction has its id, before an event takes its ``seq`` (what
  ``EventTail`` relies on).
- Text only: the statements' parameters are bound by the caller (``_ops``), never put in;
  the order it binds a write's arguments in is here (``start_args``, ``turn_args``,
  ``ask_args``), beside the numbers the statements give them.
- A part two statements share (a run started, a turn, a request) is written once, by a
  function that takes where its parameters begin (``_asked`` adds a request to a turn).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._answers import COLUMNS
from .._run_events import EventRow

__all__ = (
    "Statements",
    "arrays",
    "ask_args",
    "free",
    "request",
    "start_args",
    "started",
    "turn_args",
    "turned",
)

_HELD = "run_id = $1 AND owner = $2 AND status = 'running'"


def _events(s: str, gate: str, first: int, at: int) -> str:
    """The events insert of a statement: ``$first``, ``$first+1``, ``$first+2`` (arrays of
    run ids, kinds and data), at time ``$at``, if ``gate`` wrote a row."""
    r, k, d = first, first + 1, first + 2
    return (
        f"INSERT INTO {s}.events (run_id, kind, data, at) SELECT t.r, t.k, t.d, ${at}"
        f" FROM unnest(${r}::text[], ${k}::text[], ${d}::text[]) WITH ORDINALITY"
        f" AS t(r, k, d, i) WHERE EXISTS (SELECT 1 FROM {gate}) ORDER BY t.i"
    )


def _close(s: str, gate: str, also: str = "") -> str:
    """Close the run's pending requests (and mark its answers delivered), if ``gate``
    wrote a row and ``also`` holds; locked in the order of their ids first (``_order``:
    a lone write's batch locks nothing else first)."""
    return (
        f"UPDATE {s}.requests SET status = CASE status WHEN 'pending' THEN 'closed'"
        f" ELSE status END, delivered = 1 WHERE request_id IN (SELECT request_id FROM {s}.requests"
        f" WHERE run_id = $1{also} AND (status = 'pending' OR delivered = 0)"
        f" AND EXISTS (SELECT 1 FROM {gate}) ORDER BY request_id FOR UPDATE)"
    )


def arrays(rows: list[EventRow]) -> tuple[list[str], list[str], list[str]]:
    """Events as the three arrays a statement here inserts them from."""
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


# Each write's arguments (``PgOps``'s, after the connection) as its statement's
# parameters, in their numbers; the request's statements (``_asked``) bind a turn's or a
# start's, then a request's, with the events of both.


def start_args(args: Sequence[Any], events: list[EventRow]) -> tuple[Any, ...]:
    """``PgOps.start``'s arguments (``args``; ``events`` for its events) as $1..$10 of
    :func:`started`'s statements."""
    run_id, owner, lease_until, turn, state, prompt, now = args[:7]
    return (run_id, owner, turn, state, prompt, now, lease_until, *arrays(events))


def turn_args(args: Sequence[Any], events: list[EventRow]) -> tuple[Any, ...]:
    """``PgOps.turn``'s arguments (``args``; ``events`` for its events) as $1..$8 of
    :func:`turned`'s statements."""
    run_id, turn, owner, state, now = args[:5]
    return (run_id, owner, turn, state, now, *arrays(events))


def ask_args(args: Sequence[Any]) -> tuple[Any, ...]:
    """``PgOps.suspend``'s arguments (``args``) as the request's six parameters of
    :func:`request` (``$first`` on)."""
    _, call_id, _, request_id, body, expires_at, kind, prompt, _, _ = args
    return (request_id, call_id, body, expires_at, kind, prompt)


def free(s: str, request_id: int) -> str:
    """The request ``$request_id`` is not stored yet."""
    return f"NOT EXISTS (SELECT 1 FROM {s}.requests WHERE request_id = ${request_id})"


def started(s: str, guard: str = "") -> str:
    """A run's insert ``r`` (returning its id) and its worker's lease row ``w``, with
    :func:`start_args`' numbers; the run only if ``guard`` holds, when one is given."""
    values = "$1, 'running', $2, $3, $4, $5, $6, $6"
    rows = f"SELECT {values} WHERE {guard}" if guard else f"VALUES ({values})"
    return (
        f"WITH r AS (INSERT INTO {s}.runs (run_id, status, owner, turn, state, prompt,"
        f" created, updated) {rows} ON CONFLICT (run_id) DO NOTHING RETURNING run_id),"
        # The worker's lease row only when it has none that still runs (PgOps._known).
        f" w AS (INSERT INTO {s}.workers (name, alive_until) SELECT $2, $7 FROM r"
        f" WHERE NOT EXISTS (SELECT 1 FROM {s}.workers WHERE name = $2"
        " AND alive_until >= $6) ON CONFLICT (name) DO UPDATE SET alive_until ="
        f" GREATEST({s}.workers.alive_until, excluded.alive_until))"
    )


def turned(s: str, guard: str = "") -> str:
    """A held run's turn ``u``, the earlier turn's results deleted (``d``) and its
    requests closed (``c``), with :func:`turn_args`' numbers; only if ``guard`` holds,
    when one is given."""
    also = f" AND {guard}" if guard else ""
    return (
        f"WITH u AS (UPDATE {s}.runs SET turn = $3, state = $4, updated = $5 WHERE {_HELD}"
        f"{also} RETURNING 1),"
        f" d AS (DELETE FROM {s}.results WHERE run_id = $1 AND $3 > 1"
        " AND EXISTS (SELECT 1 FROM u)),"
        f" c AS ({_close(s, 'u', ' AND turn < $3 AND $3 > 1')})"
    )


def request(s: str, first: int, run: str, turn: str, at: int, source: str) -> str:
    """A pending request's insert from ``source``'s row: :func:`ask_args`' six from
    ``$first`` on, its run ``run``, its turn ``turn`` (expressions), raised at ``$at``."""
    return (
        f"INSERT INTO {s}.requests (request_id, run_id, call_id, turn, body, status,"
        f" expires_at, kind, prompt, raised_at) SELECT ${first}, {run}, ${first + 1}, {turn},"
        f" ${first + 2}, 'pending', ${first + 3}, ${first + 4}, ${first + 5}, ${at}"
        f" FROM {source} ON CONFLICT (request_id) DO NOTHING RETURNING 1"
    )


class Statements:
    """The single-statement writes of one schema ``s``."""

    def __init__(self, s: str) -> None:
        # $1 run_id, $2 owner, $3 turn, $4 state, $5 prompt, $6 now, $7 lease_until,
        # $8..$10 events (``start_args``).
        self.start = f"{started(s)}, e AS ({_events(s, 'r', 8, 6)}) SELECT count(*) FROM r"
        # $1 run_id, $2 owner, $3 turn, $4 state, $5 now, $6..$8 events (``turn_args``).
        self.turn = f"{turned(s)}, e AS ({_events(s, 'u', 6, 5)}) SELECT count(*) FROM u"
        # $1 run_id, $2 owner, $3 call_id, $4 record, $5 the expired request's id (or
        # NULL), $6..$8 events (the expiry first, if any, then the result), $9 now.
        self.record = (
            f"WITH x AS (INSERT INTO {s}.results (run_id, call_id, record)"
            f" SELECT $1, $3, $4 WHERE EXISTS (SELECT 1 FROM {s}.runs WHERE {_HELD})"
            " ON CONFLICT (run_id, call_id) DO UPDATE SET record = excluded.record"
            " RETURNING 1),"
            f" p AS (SELECT 1 FROM {s}.requests WHERE request_id = $5 AND status = 'pending'),"
            f" e AS (INSERT INTO {s}.events (run_id, kind, data, at) SELECT t.r, t.k, t.d, $9"
            " FROM unnest($6::text[], $7::text[], $8::text[]) WITH ORDINALITY AS t(r, k, d, i)"
            " WHERE EXISTS (SELECT 1 FROM x)"
            # Not for a result stored already as it is (a write retried after its reply
            # was lost: it had committed); the statement reads the table as it was.
            f" AND NOT EXISTS (SELECT 1 FROM {s}.results WHERE run_id = $1 AND call_id = $3"
            " AND record = $4)"
            # The expiry's event (the first row, when there are two) only if still pending.
            " AND (t.i = array_length($6::text[], 1) OR EXISTS (SELECT 1 FROM p))"
            " ORDER BY t.i)"
            " SELECT count(*) FROM x"
        )
        # $1 run_id, $2 owner, $3..$8 the request (``ask_args``), $9..$11 events, $12 now.
        self.suspend = (
            f"WITH q AS ({request(s, 3, 'run_id', 'turn', 12, f'{s}.runs WHERE {_HELD}')}),"
            f" e AS ({_events(s, 'q', 9, 12)})"
            " SELECT count(*) FROM q"
        )
        # $1 run_id, $2 owner, $3 final, $4 now, $5 outcome, $6 text, $7..$9 events.
        self.finish = (
            f"WITH u AS (UPDATE {s}.runs SET status = 'done', owner = NULL, final = $3,"
            f" updated = $4, outcome = $5, text = $6 WHERE {_HELD} RETURNING 1),"
            f" d AS (DELETE FROM {s}.results WHERE run_id = $1 AND EXISTS (SELECT 1 FROM u)),"
            f" c AS ({_close(s, 'u')}),"
            f" e AS ({_events(s, 'u', 7, 4)})"
            " SELECT count(*) FROM u"
        )
        # $1 request_id, $2 answer, $3 delivered, $4 now, $5 by, $6..$8 the event,
        # $9..$17 the audit row (``_answers.COLUMNS``).
        self.take = (
            f"WITH u AS (UPDATE {s}.requests SET status = 'answered', answer = $2,"
            " delivered = $3, answered_at = $4, answered_by = $5"
            " WHERE request_id = $1 AND status = 'pending' RETURNING 1),"
            f" e AS (INSERT INTO {s}.events (run_id, kind, data, at)"
            " SELECT $6, $7, $8, $4 FROM u),"
            f" a AS (INSERT INTO {s}.answers ({COLUMNS})"
            " VALUES ($9, $10, $11, $12, $13, $14, $15, $16, $17))"
            " SELECT count(*) FROM u"
        )
