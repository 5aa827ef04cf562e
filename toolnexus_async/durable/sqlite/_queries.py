"""The run store's queries: each a synchronous function over an open SQLite connection.

Rules of this module: reads only (the writes are ``_ops``), and the listings' statements
are ``_listing``'s, which both stores share; each query is driven by a
small index (``_schema``), so that what a host asks every second (what can go on, what to
hand over) costs what it finds, not what the store holds. A row that cannot be read back
raises :class:`StoreError` naming its run where that run is asked for (``find``, ``load``);
a listing (``outstanding``, ``requests``, ``deliveries``) leaves the row out with a warning
naming the run, so that one damaged run does not hide the others.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from ..._core.audit import AnswerRecord
from ..._core.errors import UnknownRequestError
from ..._core.types import Answer, Request
from .._answers import records, select_sql
from .._listing import (
    Dialect,
    RequestPage,
    RequestQuery,
    RunPage,
    RunQuery,
    RunView,
    request_page,
    requests_sql,
    run_page,
    run_view,
    runs_sql,
    view_sql,
    waiting_sql,
)
from .._rows import delivery_of, listed, request_of, run_of, summary_of
from .._run_events import EventRead, StoredEvent
from .._store import RunSummary, StoredRequest, StoredRun
from ._schema import OPEN

__all__ = (
    "answers",
    "deliveries",
    "event_bounds",
    "events",
    "find",
    "list_requests",
    "list_runs",
    "load",
    "lower",
    "outstanding",
    "ready",
    "requests",
    "runs",
    "view",
)


def _one(conn: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> Any:
    return conn.execute(sql, tuple(params)).fetchone()


def ready(conn: sqlite3.Connection, now: float, limit: int) -> list[str]:
    # Four ways a run can go on now, each found through its own (small) index: its
    # worker's lease ran out; it was let go mid-way; it is halted and an answer or an
    # expiry waits for it; or it is halted and a request's time ran out unanswered.
    # The undelivered requests are named as the outer loop (INDEXED BY, CROSS JOIN):
    # left to itself, SQLite scans every run in ``seq`` order for the union's ORDER BY
    # (about 20 to 40 ms each second with 100,000 runs parked, in the store's one thread).
    unsettled = (
        " AND q.turn = r.turn AND NOT EXISTS (SELECT 1 FROM results x"
        "  WHERE x.run_id = q.run_id AND x.call_id = q.call_id)"
    )
    rows = conn.execute(
        "SELECT seq, run_id FROM runs WHERE status = 'running'"
        " AND owner IN (SELECT name FROM workers WHERE alive_until < :now)"
        " UNION SELECT seq, run_id FROM runs WHERE status = 'running' AND owner IS NULL"
        " UNION SELECT r.seq, r.run_id FROM requests q INDEXED BY requests_undelivered"
        " CROSS JOIN runs r ON r.run_id = q.run_id"
        f" WHERE q.delivered = 0 AND r.status = 'halted'{unsettled}"
        " UNION SELECT r.seq, r.run_id FROM requests q JOIN runs r USING (run_id)"
        " WHERE q.status = 'pending' AND q.expires_at IS NOT NULL"
        f" AND q.expires_at <= :now AND r.status = 'halted'{unsettled}"
        " ORDER BY 1 LIMIT :limit",
        {"now": now, "limit": limit},
    ).fetchall()
    return [row[1] for row in rows]


def deliveries(conn: sqlite3.Connection, owner: str) -> list[tuple[str, Answer]]:
    # Driven by the undelivered requests (few), never by the runs the worker holds
    # (every run parked here: 0.3 s twice a second with 100,000 parked); see ``ready``.
    rows = conn.execute(
        "SELECT q.run_id, q.answer FROM requests q INDEXED BY requests_undelivered"
        " CROSS JOIN runs r ON r.run_id = q.run_id"
        " WHERE q.delivered = 0 AND q.status = 'answered' AND r.owner = ?"
        " AND q.turn = r.turn ORDER BY q.seq",
        (owner,),
    ).fetchall()
    return [(run_id, answer) for run_id, answer in listed(rows, delivery_of) if answer]


def requests(conn: sqlite3.Connection, now: float) -> list[Request]:
    return [stored.request for stored in outstanding(conn, now)]


def outstanding(conn: sqlite3.Connection, now: float) -> list[StoredRequest]:
    rows = conn.execute(
        "SELECT q.body, q.run_id, q.call_id FROM requests q JOIN runs r USING (run_id)"
        f" WHERE q.status = 'pending' AND q.turn = r.turn AND r.status IN {OPEN}"
        " AND (q.expires_at IS NULL OR q.expires_at > ?)"
        " AND NOT EXISTS (SELECT 1 FROM results x"
        "  WHERE x.run_id = q.run_id AND x.call_id = q.call_id)"
        " ORDER BY q.seq",
        (now,),
    ).fetchall()
    return listed(rows, lambda row: request_of(row[0], row[1], row[2], "pending"))


def find(conn: sqlite3.Connection, request_id: str) -> StoredRequest:
    row = _one(
        conn,
        "SELECT body, run_id, call_id, status, answer FROM requests WHERE request_id = ?",
        (request_id,),
    )
    if row is None:
        raise UnknownRequestError(request_id, f"no run waits for request {request_id!r}")
    return request_of(*row)


def load(conn: sqlite3.Connection, run_id: str) -> StoredRun:
    row = _one(
        conn,
        "SELECT r.status, r.owner, w.alive_until, r.turn, r.state FROM runs r"
        " LEFT JOIN workers w ON w.name = r.owner WHERE r.run_id = ?",
        (run_id,),
    )
    if row is None:
        raise UnknownRequestError(run_id, f"no stored run {run_id!r}")
    turn = row[3]
    results = conn.execute("SELECT call_id, record FROM results WHERE run_id = ?", (run_id,))
    requests = conn.execute(
        "SELECT call_id, body, status, answer, raised_at, answered_at FROM requests"
        " WHERE run_id = ? AND turn = ? ORDER BY seq",
        (run_id, turn),
    )
    return run_of(run_id, row, results, requests)


def runs(conn: sqlite3.Connection, limit: int) -> list[RunSummary]:
    rows = conn.execute(
        "SELECT run_id, status, prompt, final, error FROM runs ORDER BY seq DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [summary_of(*row) for row in rows]


# -- what a store lists for people (``_listing``) ------------------------------------------

SQLITE = Dialect("", "tnx_lower", "instr")


def lower(text: object) -> str | None:
    """``tnx_lower``: SQLite's text lower-cased as Python (and PostgreSQL) do."""
    return text.lower() if isinstance(text, str) else None


def list_runs(conn: sqlite3.Connection, query: RunQuery, now: float) -> RunPage:
    page, total, counts = runs_sql(SQLITE, query, now)
    rows = conn.execute(*page).fetchall()
    ids = [row[1] for row in rows[: query.limit]]
    waiting = conn.execute(*waiting_sql(SQLITE, ids, now)).fetchall() if ids else []
    return run_page(
        rows,
        waiting,
        conn.execute(*total).fetchone()[0],
        conn.execute(*counts).fetchall(),
        query.limit,
    )


def list_requests(conn: sqlite3.Connection, query: RequestQuery, now: float) -> RequestPage:
    page, total, counts = requests_sql(SQLITE, query, now)
    return request_page(
        conn.execute(*page).fetchall(),
        conn.execute(*total).fetchone()[0],
        conn.execute(*counts).fetchall(),
        query.limit,
    )


def view(conn: sqlite3.Connection, run_id: str, now: float) -> RunView:
    run, results, requests = view_sql(SQLITE, run_id, now)
    row = conn.execute(*run).fetchone()
    if row is None:
        raise UnknownRequestError(run_id, f"no run {run_id!r}")
    answers = conn.execute(select_sql(""), (run_id,))
    return run_view(row, conn.execute(*results), conn.execute(*requests), answers)


def answers(conn: sqlite3.Connection, run_id: str) -> tuple[AnswerRecord, ...]:
    return records(conn.execute(select_sql(""), (run_id,)))


def events(conn: sqlite3.Connection, after: int, limit: int) -> EventRead:
    rows = conn.execute(
        "SELECT seq, run_id, kind, data FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit),
    )
    return EventRead(tuple(StoredEvent(*row) for row in rows))


def event_bounds(conn: sqlite3.Connection) -> tuple[int, int]:
    low, high = conn.execute("SELECT min(seq), max(seq) FROM events").fetchone()
    return (low or 0, high or 0)
