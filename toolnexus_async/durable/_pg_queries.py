"""The run store's reads in PostgreSQL: ``_queries``'s, in another dialect.

Each read is one function over a connection inside a transaction its caller opened, and
the schema ``s`` its tables are in; the rows become values through the same functions as
SQLite's (``_queries.run_of``, ``request_of``, ``summary_of``, and ``listed``, which
leaves a damaged row out of a listing), so the two stores answer alike.
"""

from __future__ import annotations

from typing import Any

from .._errors import UnknownRequestError
from .._types import Answer
from ._queries import delivery_of, listed, request_of, run_of, summary_of
from ._store import RunSummary, StoredRequest, StoredRun

__all__ = ("deliveries", "find", "load", "outstanding", "ready", "runs")


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
        f"SELECT call_id, body, status, answer FROM {s}.requests"
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
