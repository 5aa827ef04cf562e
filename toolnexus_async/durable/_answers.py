"""The ``answers`` table: every answer a store was given, append-only.

Rules of this module:

- **Written with the answer, never after it.** ``accept`` inserts the record in the
  transaction that takes the answer (or refuses it), so no answer is acknowledged before
  its record commits, and a record is never read for an answer that did not commit.
- **Append-only.** A row is inserted once and never changed or removed: no statement of
  the package updates or deletes ``answers`` (``tests/test_audit.py`` reads the source to
  check it), and both stores refuse it in the database itself (SQLite triggers, a
  PostgreSQL trigger function for UPDATE, DELETE and TRUNCATE). Pruning ended runs leaves
  their records: the trail outlives the runs it tells of. Keeping it bounded is the
  operator's (an archive, then a new store); nothing here forgets a record.
- An answer taken writes one record; an answer refused (answered already, expired, its run
  went on, it approved another call) writes one too, ``outcome = "refused"``, beside the
  record of the answer that was taken, which it never changes. An answer to an unknown
  request writes nothing (there is no run to file it under).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .._core.audit import AnswerRecord, refusal_detail, shown_digest, taken_outcome
from .._core.errors import StoreError
from .._core.types import Request
from ._decide import accepted

__all__ = (
    "INSERT",
    "AuditRow",
    "records",
    "refused_row",
    "select_sql",
    "taken_row",
)

# (request_id, run_id, call_id, outcome, detail, answered_by, worker, digest, at)
AuditRow = tuple[str, str, str, str, str | None, str | None, str | None, str, float]

COLUMNS = "request_id, run_id, call_id, outcome, detail, answered_by, worker, digest, at"

INSERT = f"INSERT INTO {{s}}answers ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"


def taken_row(
    request: Request,
    run_id: str,
    call_id: str,
    ok: bool,
    reason: str | None,
    answered_by: str | None,
    worker: str | None,
    now: float,
) -> AuditRow:
    """The record of an answer taken."""
    outcome, detail = taken_outcome(ok, reason)
    return (
        request.id,
        run_id,
        call_id,
        outcome,
        detail,
        answered_by,
        worker,
        shown_digest(request),
        now,
    )


def refused_row(
    row: Sequence[Any] | None,
    refusal: Exception,
    answered_by: str | None,
    worker: str | None,
    now: float,
) -> AuditRow | None:
    """The record of an answer refused, from its request's row (as ``_decide.judge`` reads
    it); ``None`` when there is nothing to file it under (an unknown request, or one whose
    row cannot be read back: the refusal itself is still told its sender)."""
    detail = refusal_detail(refusal)
    if row is None or detail is None:
        return None
    try:
        taken = accepted(row)
    except StoreError:
        return None
    request = taken.request
    digest = shown_digest(request)
    return (
        request.id,
        taken.run_id,
        taken.call_id,
        "refused",
        detail,
        answered_by,
        worker,
        digest,
        now,
    )


def select_sql(prefix: str) -> str:
    """The records of one run (``?``: its id), in the order they were written."""
    return f"SELECT {COLUMNS} FROM {prefix}answers WHERE run_id = ? ORDER BY seq"


def records(rows: Iterable[Sequence[Any]]) -> tuple[AnswerRecord, ...]:
    return tuple(
        AnswerRecord(
            request_id=request_id,
            run_id=run_id,
            call_id=call_id,
            outcome=outcome,
            detail=detail,
            answered_by=answered_by,
            at=float(at),
            digest=digest,
            worker=worker,
        )
        for request_id, run_id, call_id, outcome, detail, answered_by, worker, digest, at in rows
    )
