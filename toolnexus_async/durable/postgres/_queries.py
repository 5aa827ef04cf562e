"""The run store's reads in PostgreSQL: ``_queries``'s, in another dialect.

Each read is one function over a connection inside a transaction its caller opened, and
the schema ``s`` its tables are in; the rows become values through the same functions as
SQLite's (``_queries.run_of``, ``request_of``, ``summary_of``, and ``listed``, which
leaves a damaged row out of a listing), so the two stores answer alike.
"""

from __future__ import annotations

from typing import Any

from ..._core.audit import AnswerRecord
from ..._core.errors import UnknownRequestError
from ..._core.types import Answer
from .._answers import records, select_sql
from .._listing import (
    Dialect,
    RequestPage,
    RequestQuery,
    RunPage,
    RunQuery,
    RunView,
    numbered,
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

__all__ = (
    "answers",
    "deliveries",
    "event_bounds",
    "events",
    "find",
    "list_requests",
    "list_runs",
    "load",
    "outstanding",
    "ready",
    "runs",
    "view",
)


async def ready(conn: Any, s: str, now: float, limit: int) -> list[str]:
    unsettled = (
        f" AND q.turn = r.turn AND NOT EXISTS (SELECT 1 FROM {s}.results x"
        "  WHERE x.run_id = q.run_id AND x.call_id = q.call_id)"
    )
    rows = await conn.fetch(
        f"SELECT seq, run_id FROM {s}.runs WHERE status = 'running'"
        f" AND owner IN (SELECT name FROM {s}.workers WHERE alive_until < $1)"
        f" UNION SELECT seq, run_id FROM {s}.runs WHERE status = 'running' AND owner IS NULL"
        f" UNION SELECT r.seq, r.run_id FROM {s}.requests q JOIN {s}.runs r USING (run_id)"
        f" WHERE q.delivered = 0 AND r.status = 'halted'{unsettled}"
        f" UNION SELECT r.seq, r.run_id FROM {s}.requests q JOIN {s}.runs r USING (run_id)"
        " WHERE q.status = 'pending' AND q.expires_at IS NOT NULL"
        f" AND q.expires_at <= $1 AND r.status = 'halted'{unsettled}"
        " ORDER BY 1 LIMIT $2",
        now,
        limit,
    )
    return [row[1] for row in rows]


async def deliveries(conn: Any, s: str, owner: str) -> list[tuple[str, Answer]]:
    rows = await conn.fetch(
        f"SELECT q.run_id, q.answer FROM {s}.requests q JOIN {s}.runs r"
        " USING (run_id) WHERE q.delivered = 0 AND q.status = 'answered' AND r.owner = $1"
        " AND q.turn = r.turn ORDER BY q.seq",
        owner,
    )
    return [(run_id, answer) for run_id, answer in listed(rows, delivery_of) if answer]


async def outstanding(conn: Any, s: str, now: float) -> list[StoredRequest]:
    rows = await conn.fetch(
        f"SELECT q.body, q.run_id, q.call_id FROM {s}.requests q"
        f" JOIN {s}.runs r USING (run_id)"
        " WHERE q.status = 'pending' AND q.turn = r.turn"
        " AND r.status IN ('running', 'halted')"
        " AND (q.expires_at IS NULL OR q.expires_at > $1)"
        f" AND NOT EXISTS (SELECT 1 FROM {s}.results x"
        "  WHERE x.run_id = q.run_id AND x.call_id = q.call_id)"
        " ORDER BY q.seq",
        now,
    )
    return listed(rows, lambda row: request_of(row[0], row[1], row[2], "pending"))


async def find(conn: Any, s: str, request_id: str) -> StoredRequest:
    row = await conn.fetchrow(
        f"SELECT body, run_id, call_id, status, answer FROM {s}.requests WHERE request_id = $1",
        request_id,
    )
    if row is None:
        raise UnknownRequestError(request_id, f"no run waits for request {request_id!r}")
    return request_of(*row)


async def load(conn: Any, s: str, run_id: str) -> StoredRun:
    row = await conn.fetchrow(
        f"SELECT r.status, r.owner, w.alive_until, r.turn, r.state FROM {s}.runs r"
        f" LEFT JOIN {s}.workers w ON w.name = r.owner WHERE r.run_id = $1",
        run_id,
    )
    if row is None:
        raise UnknownRequestError(run_id, f"no stored run {run_id!r}")
    results = await conn.fetch(f"SELECT call_id, record FROM {s}.results WHERE run_id = $1", run_id)
    requests = await conn.fetch(
        f"SELECT call_id, body, status, answer, raised_at, answered_at FROM {s}.requests"
        " WHERE run_id = $1 AND turn = $2 ORDER BY seq",
        run_id,
        row[3],
    )
    return run_of(run_id, tuple(row), map(tuple, results), map(tuple, requests))


async def runs(conn: Any, s: str, limit: int) -> list[RunSummary]:
    rows = await conn.fetch(
        f"SELECT run_id, status, prompt, final, error FROM {s}.runs ORDER BY seq DESC LIMIT $1",
        limit,
    )
    return [summary_of(*row) for row in rows]


# -- listings, a run whole, events ----------------------------------------------------------


def dialect(s: str) -> Dialect:
    return Dialect(f"{s}.", "lower", "strpos")


async def _all(conn: Any, statement: tuple[str, list[Any]]) -> list[tuple[Any, ...]]:
    sql, args = statement
    return [tuple(row) for row in await conn.fetch(numbered(sql), *args)]


async def list_runs(conn: Any, s: str, query: RunQuery, now: float) -> RunPage:
    d = dialect(s)
    page, total, counts = runs_sql(d, query, now)
    rows = await _all(conn, page)
    ids = [row[1] for row in rows[: query.limit]]
    waiting = await _all(conn, waiting_sql(d, ids, now)) if ids else []
    return run_page(
        rows, waiting, (await _all(conn, total))[0][0], await _all(conn, counts), query.limit
    )


async def list_requests(conn: Any, s: str, query: RequestQuery, now: float) -> RequestPage:
    page, total, counts = requests_sql(dialect(s), query, now)
    return request_page(
        await _all(conn, page),
        (await _all(conn, total))[0][0],
        await _all(conn, counts),
        query.limit,
    )


async def view(conn: Any, s: str, run_id: str, now: float) -> RunView:
    run, results, requests = view_sql(dialect(s), run_id, now)
    rows = await _all(conn, run)
    if not rows:
        raise UnknownRequestError(run_id, f"no run {run_id!r}")
    answers = await _all(conn, (select_sql(f"{s}."), [run_id]))
    return run_view(rows[0], await _all(conn, results), await _all(conn, requests), answers)


async def answers(conn: Any, s: str, run_id: str) -> list[AnswerRecord]:
    return list(records(await _all(conn, (select_sql(f"{s}."), [run_id]))))


async def events(conn: Any, s: str, after: int, limit: int) -> EventRead:
    """The events after ``after`` and the transactions in progress, seen in one statement's
    snapshot: see ``_run_events.EventTail``."""
    rows = await conn.fetch(
        "SELECT pg_current_snapshot()::text, e.seq, e.run_id, e.kind, e.data"
        " FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT seq, run_id, kind, data"
        f" FROM {s}.events WHERE seq > $1 ORDER BY seq LIMIT $2) AS e ON true ORDER BY e.seq",
        after,
        limit,
    )
    xip = rows[0][0].split(":")[2]
    running = frozenset(int(x) for x in xip.split(",") if x)
    found = tuple(StoredEvent(*row[1:]) for row in rows if row[1] is not None)
    return EventRead(found, running)


async def event_bounds(conn: Any, s: str) -> tuple[int, int]:
    low, high = await conn.fetchrow(f"SELECT min(seq), max(seq) FROM {s}.events")
    return (low or 0, high or 0)
