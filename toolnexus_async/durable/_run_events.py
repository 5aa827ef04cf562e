"""The run events a store keeps: what happened to each run, in the order it committed.

Rules of this module:

- **Written with the change, never after it.** Every store write that changes what a
  person sees of a run (it started, the model asked for tools, a call's result, a request,
  an answer or an expiry, its end) inserts its event rows in the transaction that commits
  the change: one more row in a transaction that commits anyway, not a transaction of its
  own. So an event is never read before what it tells of is committed, and never lost
  once it is.
- An event row is ``(seq, run_id, kind, data, at)``: ``seq`` grows with every event on
  the store (SQLite: ``AUTOINCREMENT``, never reused; PostgreSQL: a sequence, with gaps),
  ``data`` the JSON a client is shown, encoded once, here, on the writer's side.
- On PostgreSQL two transactions may commit in the other order than they took their
  ``seq``. A reader (:class:`EventTail`) therefore delivers events only in an unbroken run
  of ``seq``: a missing number is waited for while a transaction that may hold it is still
  in progress, and skipped once none is (its transaction rolled back). This holds because
  every transaction inserts its events after its first write, so it has its transaction id
  before it takes a ``seq`` (see the ops of both stores).
- The newest :data:`EVENTS_KEEP` events are kept; older ones are pruned with the ended
  runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs

from .._core.messages import AssistantMessage
from .._core.results import RunResult, ToolCallRecord
from .._core.types import Request
from ._rows import encode, prompt_of

__all__ = (
    "EVENTS_KEEP",
    "EventRead",
    "EventRow",
    "EventTail",
    "StoredEvent",
    "Watchers",
    "answered",
    "done",
    "expired_request",
    "failed",
    "pending",
    "saved_events",
    "started",
    "started_events",
    "tool_calls",
    "tool_result",
)

log = logging.getLogger("toolnexus_async.durable")

# Events kept in the store (the newest): a client reconnecting with an older id is told
# to fetch the lists again (a ``snapshot``). At a few hundred bytes each, tens of MB.
EVENTS_KEEP = 100_000

# (run id, kind, data as JSON): an event as a write inserts it.
EventRow = tuple[str, str, str]


@attrs.frozen
class StoredEvent:
    """One event as the store keeps it; ``data`` is its JSON text."""

    seq: int
    run_id: str
    kind: str
    data: str


@attrs.frozen
class EventRead:
    """Events after a point, in ``seq`` order, and the ids of the transactions that were in
    progress when they were read (PostgreSQL; always empty on SQLite, whose writes commit
    in ``seq`` order)."""

    events: tuple[StoredEvent, ...]
    in_progress: frozenset[int] = frozenset()


class Watchers:
    """The callbacks of a store's ``watch``: each told, quickly, that new events may have
    been committed; one that raises is logged and the others are still told."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []

    def add(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Watch from now on; returns the function that stops it."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def __call__(self) -> None:
        for callback in tuple(self._callbacks):
            try:
                callback()
            except Exception:
                log.exception("a run store watcher raised")


class EventTail:
    """Follows a store's events from ``after`` on, never past a ``seq`` that may still
    commit (see the module rules). :meth:`take` gives the events of a read that can be
    delivered now, in order, and moves :attr:`after` past them."""

    __slots__ = ("_holders", "after")

    def __init__(self, after: int) -> None:
        self.after = after
        # The transactions that were in progress when the first missing seq was seen: one
        # of them may hold it. None: no seq is missing.
        self._holders: frozenset[int] | None = None

    def take(self, read: EventRead) -> list[StoredEvent]:
        out: list[StoredEvent] = []
        for event in read.events:
            if event.seq <= self.after:
                continue
            if event.seq != self.after + 1:
                holders = self._holders if self._holders is not None else read.in_progress
                if holders & read.in_progress:
                    # A transaction that may hold the missing seq still runs: wait for it.
                    self._holders = holders
                    break
            out.append(event)
            self.after = event.seq
            self._holders = None
        return out


def _row(run_id: str, kind: str, data: dict[str, Any]) -> EventRow:
    return (run_id, kind, encode(data, f"the {kind} event of run {run_id!r}"))


def started(run_id: str, prompt: str) -> EventRow:
    return _row(run_id, "run_started", {"run_id": run_id, "prompt": prompt})


def tool_calls(state: RunResult) -> list[EventRow]:
    """A ``tool_call`` per call the model asked for in the turn ``state`` ends with."""
    last = state.messages[-1] if state.messages else None
    if not isinstance(last, AssistantMessage):
        return []
    run_id = state.run_id or ""
    return [
        _row(
            run_id,
            "tool_call",
            {"run_id": run_id, "id": c.id, "name": c.name, "arguments": c.arguments},
        )
        for c in last.tool_calls
    ]


def tool_result(run_id: str, record: ToolCallRecord) -> EventRow:
    result = record.result
    data: dict[str, Any] = {
        "run_id": run_id,
        "id": record.call.id,
        "name": record.call.name,
        "output": result.output,
        "is_error": result.is_error,
        "declined": record.answered_ok is False,
    }
    if record.changed_arguments is not None:
        data["changed_arguments"] = record.changed_arguments
    return _row(run_id, "tool_result", data)


def expired_request(record: ToolCallRecord) -> str | None:
    """The id of ``record``'s request if it may have ended without the store hearing of it
    (it expired where its run was parked): the write that records the call then tells
    ``answered``, if the store still has the request pending."""
    request = record.request
    return request.id if request is not None and record.answered_ok is not True else None


def pending(run_id: str, request: Request) -> EventRow:
    return _row(run_id, "pending", {"run_id": run_id, "request": request.to_dict()})


def answered(
    run_id: str,
    ok: bool,
    reason: str | None,
    request_id: str,
    at: float,
    by: str | None,
    answered_by: str | None = None,
) -> EventRow:
    """An answer taken (``ok``, ``reason``), or an expiry (``False``, ``"expired"``), at
    ``at`` through worker ``by``, given by ``answered_by`` (as the host authenticated
    them)."""
    data: dict[str, Any] = {"request_id": request_id, "run_id": run_id, "ok": ok, "at": at}
    if reason is not None:
        data["reason"] = reason
    if by is not None:
        data["worker"] = by
    if answered_by is not None:
        data["answered_by"] = answered_by
    return _row(run_id, "answered", data)


def done(result: RunResult) -> EventRow:
    run_id = result.run_id or ""
    declined = any(r.answered_ok is False for r in result.tool_calls)
    data = {"run_id": run_id, "status": result.status, "text": result.text, "declined": declined}
    if result.output_spec is not None:  # a run given an output schema: its validated JSON
        data["output"] = result.output_data
    return _row(run_id, "done", data)


def failed(run_id: str, error: str) -> EventRow:
    return _row(run_id, "failed", {"run_id": run_id, "status": "error", "message": error})


def started_events(state: RunResult, turn: int) -> list[EventRow]:
    """A run kept for the first time, through turn ``turn`` (0: the model was not asked)."""
    run_id = state.run_id or ""
    rows = [started(run_id, prompt_of(state))]
    return rows + tool_calls(state) if turn else rows


def saved_events(run: RunResult) -> list[EventRow]:
    """A run that halted elsewhere, kept with its outstanding requests."""
    run_id = run.run_id or ""
    asked = (r.request for r in run.suspended if r.request is not None)
    return [started(run_id, prompt_of(run)), *(pending(run_id, request) for request in asked)]
