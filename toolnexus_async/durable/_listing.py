"""What a store lists for people: pages of runs and of requests, and one run whole.

Rules of this module:

- The statements are written once, here, for both stores: a :class:`Dialect` says where
  the tables are and how text is lower-cased, and :func:`numbered` turns ``?`` into
  PostgreSQL's ``$n``. The rows become values here too, so the stores answer alike; each
  store runs them in its own reads (``sqlite._queries``, ``postgres._queries``).
- A run's status is derived from what the store holds, in SQL, never kept twice:
  ``pending`` while it is halted or holds an outstanding request in its current turn,
  ``running`` otherwise while it is open, ``done``/``incomplete`` as it ended, ``error``
  when it failed. So a listing and a filter agree with the store on every worker.
- Pages are keyed by ``seq`` (runs newest first, requests oldest first), never by an
  offset: a page is as cheap at the end of the list as at its start, and a row that
  arrives meanwhile does not shift the next page.
- ``counts`` are over everything the store lists (no filter), ``total`` over what
  matches the filters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from .._core.audit import AnswerRecord
from .._core.errors import PayloadError, StoreError
from .._core.results import RunResult, ToolCallRecord, record_from_json
from .._core.types import Answer, Request
from ._answers import records
from ._rows import answer_of, listed, request_of, stored_request
from ._store import StoredRequest

__all__ = (
    "AnsweredRow",
    "Dialect",
    "RequestPage",
    "RequestQuery",
    "RunItem",
    "RunPage",
    "RunQuery",
    "RunView",
    "numbered",
)


@attrs.frozen
class RunQuery:
    """A page of runs, newest first: at most ``limit``, older than ``before`` (a ``seq``),
    with one of ``statuses`` (any if empty), whose prompt holds ``text`` (lower case)."""

    limit: int = 100
    before: int | None = None
    statuses: tuple[str, ...] = ()
    text: str | None = None


@attrs.frozen
class RequestQuery:
    """A page of outstanding requests, oldest first: at most ``limit``, after ``after`` (a
    ``seq``), of one of ``kinds`` (any if empty), of run ``run_id``, whose prompt holds
    ``text`` (lower case)."""

    limit: int = 100
    after: int | None = None
    kinds: tuple[str, ...] = ()
    text: str | None = None
    run_id: str | None = None


@attrs.frozen
class RunItem:
    """A run as a listing shows it; ``requests``: the ids of its outstanding requests."""

    seq: int
    run_id: str
    status: str
    prompt: str
    text: str | None
    error: str | None
    created: float
    updated: float
    requests: tuple[str, ...] = ()


@attrs.frozen
class RunPage:
    runs: tuple[RunItem, ...]
    next: int | None  # the ``before`` of the next page; None: this is the last
    total: int
    counts: dict[str, int]


@attrs.frozen
class RequestPage:
    requests: tuple[StoredRequest, ...]
    next: int | None  # the ``after`` of the next page; None: this is the last
    total: int
    counts: dict[str, int]


@attrs.frozen
class AnsweredRow:
    """One request of a run and what became of it: its answer, when (seconds since the
    epoch) and through which worker it was taken."""

    request: Request
    call_id: str
    turn: int
    status: str
    answer: Answer | None
    at: float | None
    by: str | None


@attrs.frozen
class RunView:
    """A run whole: its listing, its transcript (the final one once it ended), the current
    turn's recorded results, every request it made, and every answer given, oldest first."""

    item: RunItem
    turn: int
    state: RunResult
    ended: bool
    results: dict[str, ToolCallRecord]
    requests: tuple[AnsweredRow, ...]
    answers: tuple[AnswerRecord, ...] = ()  # the audit trail (``_answers``), oldest first


@attrs.frozen
class Dialect:
    """Where the tables are (``prefix``: ``""`` or ``"schema."``), the SQL function that
    lower-cases text as Python's ``str.lower`` does (SQLite's own ``lower`` knows ASCII
    only: the SQLite store registers ``tnx_lower``), and the one that finds a substring."""

    prefix: str
    lower: str
    find: str  # (text, part) -> the 1-based place of part in text, 0 if absent


def numbered(sql: str) -> str:
    """``sql`` with each ``?`` made ``$1``, ``$2``, ... (PostgreSQL's placeholders); the
    statements here hold no ``?`` but placeholders."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


def _status(d: Dialect) -> str:
    s = d.prefix
    return (
        "CASE r.status WHEN 'halted' THEN 'pending' WHEN 'failed' THEN 'error'"
        " WHEN 'done' THEN COALESCE(r.outcome, 'done')"
        f" WHEN 'running' THEN CASE WHEN EXISTS (SELECT 1 FROM {s}requests q"
        " WHERE q.run_id = r.run_id AND q.turn = r.turn AND q.status = 'pending'"
        " AND (q.expires_at IS NULL OR q.expires_at > ?)"
        f" AND NOT EXISTS (SELECT 1 FROM {s}results x"
        "  WHERE x.run_id = q.run_id AND x.call_id = q.call_id))"
        " THEN 'pending' ELSE 'running' END ELSE r.status END"
    )


def _outstanding(d: Dialect) -> str:
    s = d.prefix
    return (
        "q.status = 'pending' AND q.turn = r.turn AND r.status IN ('running', 'halted')"
        " AND (q.expires_at IS NULL OR q.expires_at > ?)"
        f" AND NOT EXISTS (SELECT 1 FROM {s}results x"
        "  WHERE x.run_id = q.run_id AND x.call_id = q.call_id)"
    )


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


Statement = tuple[str, list[Any]]


def runs_sql(d: Dialect, query: RunQuery, now: float) -> tuple[Statement, Statement, Statement]:
    """The page (one row more than asked, to tell whether another follows), the total and
    the counts per status."""
    s = d.prefix
    shown = (
        f"SELECT r.seq AS seq, r.run_id AS run_id, {_status(d)} AS shown, r.prompt AS prompt,"
        " r.text AS text, r.error AS error, r.created AS created, r.updated AS updated"
        f" FROM {s}runs r"
    )
    inner, inner_args = shown, list[Any]([now])
    if query.text:
        inner += f" WHERE {d.find}({d.lower}(r.prompt), ?) > 0"
        inner_args.append(query.text)
    outer: list[str] = []
    outer_args: list[Any] = []
    if query.statuses:
        outer.append(f"shown IN ({_marks(query.statuses)})")
        outer_args.extend(query.statuses)
    where = f" WHERE {' AND '.join(outer)}" if outer else ""
    total = (f"SELECT count(*) FROM ({inner}) t{where}", inner_args + outer_args)
    if query.before is not None:
        outer.append("seq < ?")
        outer_args.append(query.before)
    where = f" WHERE {' AND '.join(outer)}" if outer else ""
    page = (
        f"SELECT * FROM ({inner}) t{where} ORDER BY seq DESC LIMIT ?",
        [*inner_args, *outer_args, query.limit + 1],
    )
    counts = (f"SELECT shown, count(*) FROM ({shown}) t GROUP BY shown", [now])
    return page, total, counts


def waiting_sql(d: Dialect, run_ids: Sequence[str], now: float) -> Statement:
    """The outstanding requests of ``run_ids``: (run id, request id), oldest first."""
    s = d.prefix
    return (
        f"SELECT q.run_id, q.request_id FROM {s}requests q JOIN {s}runs r USING (run_id)"
        f" WHERE q.run_id IN ({_marks(run_ids)}) AND {_outstanding(d)} ORDER BY q.seq",
        [*run_ids, now],
    )


def requests_sql(
    d: Dialect, query: RequestQuery, now: float
) -> tuple[Statement, Statement, Statement]:
    """The page (one row more than asked), the total and the counts per kind."""
    s = d.prefix
    base = f" FROM {s}requests q JOIN {s}runs r USING (run_id) WHERE {_outstanding(d)}"
    args: list[Any] = [now]
    counts = (f"SELECT q.kind, count(*){base} GROUP BY q.kind", [now])
    if query.kinds:
        base += f" AND q.kind IN ({_marks(query.kinds)})"
        args.extend(query.kinds)
    if query.run_id is not None:
        base += " AND q.run_id = ?"
        args.append(query.run_id)
    if query.text:
        base += f" AND {d.find}({d.lower}(q.prompt), ?) > 0"
        args.append(query.text)
    total = (f"SELECT count(*){base}", list(args))
    if query.after is not None:
        base += " AND q.seq > ?"
        args.append(query.after)
    page = (
        f"SELECT q.seq, q.body, q.run_id, q.call_id{base} ORDER BY q.seq LIMIT ?",
        [*args, query.limit + 1],
    )
    return page, total, counts


def view_sql(d: Dialect, run_id: str, now: float) -> tuple[Statement, Statement, Statement]:
    """The run's row, its current turn's results, and every request it made."""
    s = d.prefix
    return (
        (
            f"SELECT r.seq, r.run_id, {_status(d)}, r.prompt, r.text, r.error, r.created,"
            f" r.updated, r.turn, r.state, r.final FROM {s}runs r WHERE r.run_id = ?",
            [now, run_id],
        ),
        (f"SELECT call_id, record FROM {s}results WHERE run_id = ?", [run_id]),
        (
            "SELECT call_id, turn, body, status, answer, answered_at, answered_by, expires_at"
            f" FROM {s}requests WHERE run_id = ? ORDER BY seq",
            [run_id],
        ),
    )


# -- rows into values ------------------------------------------------------------------------


def run_page(
    rows: Sequence[Sequence[Any]],
    waiting: Iterable[Sequence[Any]],
    total: int,
    counts: Iterable[Sequence[Any]],
    limit: int,
) -> RunPage:
    more = len(rows) > limit
    rows = rows[:limit]
    asked: dict[str, list[str]] = {}
    for run_id, request_id in waiting:
        asked.setdefault(run_id, []).append(request_id)
    items = tuple(
        RunItem(
            seq, run_id, status, prompt, text, error, created, updated, tuple(asked.get(run_id, ()))
        )
        for seq, run_id, status, prompt, text, error, created, updated in rows
    )
    return RunPage(items, items[-1].seq if more else None, total, _counted(counts))


def request_page(
    rows: Sequence[Sequence[Any]], total: int, counts: Iterable[Sequence[Any]], limit: int
) -> RequestPage:
    more = len(rows) > limit
    rows = rows[:limit]
    found = listed(rows, lambda row: request_of(row[1], row[2], row[3], "pending"))
    return RequestPage(tuple(found), rows[-1][0] if more else None, total, _counted(counts))


def _counted(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    return {str(key): int(n) for key, n in rows if key is not None}


def run_view(
    row: Sequence[Any],
    results: Iterable[Sequence[Any]],
    requests: Iterable[Sequence[Any]],
    answers: Iterable[Sequence[Any]] = (),
) -> RunView:
    """A :class:`RunView` from its rows (see :func:`view_sql`); :class:`StoreError` naming
    the run if what it needs cannot be read back."""
    seq, run_id, status, prompt, text, error, created, updated, turn, state, final = row
    where = f"stored run {run_id!r}"
    ended = final is not None
    try:
        transcript = RunResult.from_dict(final if ended else state)
        recorded = {
            call_id: record_from_json(json.loads(record), f"{where} result {call_id!r}")
            for call_id, record in results
        }
        asked = tuple(
            AnsweredRow(
                stored_request(body, run_id, call_id),
                call_id,
                q_turn,
                q_status,
                answer_of(answer),
                at,
                by,
            )
            for call_id, q_turn, body, q_status, answer, at, by, _ in requests
        )
    except (PayloadError, ValueError, TypeError) as exc:
        raise StoreError(f"{where} cannot be read: {exc}") from None
    waiting = tuple(
        r.request.id
        for r in asked
        if status == "pending"
        and r.status == "pending"
        and r.turn == turn
        and r.call_id not in recorded
        and _left(r.request)
    )
    item = RunItem(seq, run_id, status, prompt, text, error, created, updated, waiting)
    return RunView(item, turn, transcript, ended, recorded, asked, records(answers))


def _left(request: Request) -> bool:
    left = request.seconds_left()
    return left is None or left > 0
