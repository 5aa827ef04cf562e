"""What the run stores' operations decide alike, on SQLite and on PostgreSQL.

- :func:`judge` and :func:`accepted`: whether an answer is taken, refused (and with what),
  or marks its request expired, from the request's row joined with its run; the two stores
  read that row in their own SQL and decide from it here, so they cannot decide apart.
- :class:`Saved` and :func:`saved`: a run halted elsewhere, in the encoded form a store
  keeps (``RunStore.save``), with the reasons one cannot be kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from .._core.errors import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    RequestExpiredError,
    UnknownRequestError,
    UsageError,
)
from .._core.loop import HaltedTurn
from .._core.results import RunResult, record_to_json
from ._rows import ENCODE, prompt_of, state_text, stored_request
from ._store import Accepted

__all__ = ("Saved", "accepted", "damaged_reason", "judge", "saved")


@attrs.frozen
class Saved:
    """A halted run as a store keeps it, encoded: its state through the halted turn, the
    turn's recorded results as (call id, record), its requests as (request id, call id,
    body, expires_at)."""

    run_id: str
    turn: int
    state: str
    prompt: str
    results: tuple[tuple[str, str], ...]
    requests: tuple[tuple[str, str, str, float | None], ...]


def saved(run: RunResult) -> Saved:
    """``run`` (halted elsewhere) ready to keep, or the reason it cannot be kept.

    Raises:
        UsageError: the run did not halt, has no id, or no outstanding request.
        PayloadError: it cannot be written as JSON.
    """
    if run.status != "pending":
        raise UsageError(f"only a halted run can be stored; run {run.run_id!r} is {run.status!r}")
    if not run.run_id:
        raise UsageError("a run without a run_id cannot be stored")
    pending = [(r, r.request) for r in run.suspended if r.request is not None]
    if not pending:
        raise UsageError(f"run {run.run_id!r} has no outstanding request to file it under")
    halted = HaltedTurn.of(run.messages)
    # The run through its halted turn, as a running run's state is kept.
    state = attrs.evolve(
        run,
        status="incomplete",
        messages=(*halted.before, halted.assistant),
        tool_calls=tuple(r for r in run.tool_calls if r.turn < run.turns),
        limit="running",
    )
    return Saved(
        run.run_id,
        run.turns,
        state_text(state),
        prompt_of(state),
        tuple(
            (record.call.id, ENCODE(record_to_json(record)))
            for record in run.tool_calls
            if record.turn == run.turns and record.call.id in halted.completed
        ),
        tuple(
            (
                request.id,
                record.call.id,
                ENCODE(request.to_dict()),
                None if (left := request.seconds_left()) is None else _now_plus(left),
            )
            for record, request in pending
        ),
    )


def judge(answer_id: str, row: Sequence[Any] | None, now: float) -> tuple[Exception | None, bool]:
    """Whether an answer to ``answer_id`` is refused (and with what), and whether its
    request is to be marked expired, from its ``requests`` row joined with its run (body,
    run id, call id, status, expires_at, owner, lease, run status, current turn?)."""
    if row is None:
        return UnknownRequestError(answer_id, f"no run waits for request {answer_id!r}"), False
    _, run_id, _, status, expires, _, _, run_status, current = row
    if status == "answered":
        refused = AlreadyAnsweredError(answer_id, f"request {answer_id!r} was answered already")
        return refused, False
    if status == "expired" or (
        status in ("pending", "closed") and expires is not None and expires <= now
    ):
        expired = RequestExpiredError(answer_id, f"request {answer_id!r} expired before the answer")
        return expired, status == "pending"
    if status != "pending" or run_status in ("done", "failed") or not current:
        closed = AlreadyResumedError(
            answer_id, f"request {answer_id!r} (run {run_id!r}) is closed: the run went on"
        )
        return closed, False
    return None, False


def accepted(row: Sequence[Any]) -> Accepted:
    """The :class:`Accepted` of an answer :func:`judge` let through, from the same row.

    Raises:
        StoreError: the request's row is damaged (its run cannot be read back either).
            The stores call this before they write the answer, so that the refusal
            changes nothing.
    """
    body, run_id, call_id, _, _, owner, lease, _, _ = row
    return Accepted(stored_request(body, run_id, call_id), run_id, call_id, owner, lease)


def damaged_reason(exc: Exception) -> str:
    """The error a run that cannot be read back is failed with (both stores say the same)."""
    return f"cannot be read back, so it cannot go on (marked failed): {exc}"


def _now_plus(seconds: float) -> float:
    return time.time() + seconds
