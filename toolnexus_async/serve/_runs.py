"""Runs and requests as the API shows them, read from the store, and the task that drives a run.

Rules of this module:

- **The store is the source of truth for every read, on every worker.** ``GET /runs``,
  ``GET /runs/{id}`` and ``GET /requests`` show what the store holds (``RunStore.list_runs``,
  ``run_view``, ``list_requests``), never a book of this process: a run started on
  another worker, or that ended there, is shown as it stands, so no worker shows a status
  the store contradicts. Events come from the store too (``_feed``).
- A run's status is the store's (``durable._listing``): ``pending`` while it waits for at
  least one answer, ``running`` while it is otherwise open, ``done``/``incomplete`` as it
  ended, ``error`` when it failed.
- A request goes out (``GET /requests``, a step, the ``pending`` event) as
  ``Request.to_dict()``, unchanged, plus its ``display`` (``_display``): one helper,
  :func:`shown`, for all of them.
- A run's steps are every executed call in order, from its transcript (the final one once
  it ended), the current turn's recorded results and the calls still waiting; each with the
  request it raised and the answer it got: when, through which worker, who gave it
  (``answered_by``) and the digest of what the request showed. Beside them, ``answers`` is
  the run's audit trail as the store keeps it (``RunStore.answers``): every answer given,
  refused ones included, oldest first.
"""

from __future__ import annotations

import logging
from typing import Any

from .._core.messages import AssistantMessage, ToolCall, ToolReturn
from .._core.results import ToolCallRecord
from .._core.types import Request
from ..durable._begun import BegunRun
from ..durable._listing import AnsweredRow, RunItem, RunView
from ..durable._store import LeaseLostError
from ..suspend import Inbox
from ._display import display_of

__all__ = ("ServeInbox", "drive", "run_detail", "run_item", "shown")

log = logging.getLogger("toolnexus_async.serve")


def shown(request: Request, **extra: Any) -> dict[str, Any]:
    """A request as the API sends it: its wire form, ``extra`` (a listing's ``run_id``),
    and its ``display``."""
    wire = {**request.to_dict(), **extra}
    return {**wire, "display": display_of(wire)}


def run_item(item: RunItem) -> dict[str, Any]:
    """A run as ``GET /runs`` lists it."""
    return {
        "id": item.run_id,
        "status": item.status,
        "prompt": item.prompt,
        "text": item.text,
        "error": item.error,
        "created": item.created,
        "updated": item.updated,
        "requests": list(item.requests),
    }


def run_detail(view: RunView) -> dict[str, Any]:
    """A run as ``GET /runs/{id}`` shows it: its listing, ``declined``, its steps, its
    audit trail (``answers``), and its ``output_schema`` and validated ``output`` (both
    ``null`` for a run started without a schema)."""
    steps = _steps(view)
    declined = any(step["declined"] for step in steps)
    taken = {r.request_id: r for r in view.answers if r.outcome != "refused"}
    for step in steps:
        answer, request = step.get("answer"), step.get("request")
        record = taken.get(request["id"]) if answer is not None and request is not None else None
        if answer is not None:
            answer["answered_by"] = None if record is None else record.answered_by
            answer["digest"] = None if record is None else record.digest
    answers = [record.to_dict() for record in view.answers]
    spec = view.state.output_spec
    return {
        **run_item(view.item),
        "declined": declined,
        "steps": steps,
        "answers": answers,
        "output_schema": spec.schema if spec is not None else None,
        "output": view.state.output_data if spec is not None else None,
    }


def _steps(view: RunView) -> list[dict[str, Any]]:
    state = view.state
    run_id = view.item.run_id
    returns = {m.call_id: m for m in state.messages if isinstance(m, ToolReturn)}
    asked = {(row.turn, row.call_id): row for row in view.requests}
    steps = [_step(run_id, r, returns, asked) for r in state.tool_calls]
    last = state.messages[-1] if state.messages else None
    if view.ended or not view.turn or not isinstance(last, AssistantMessage):
        return steps
    for call in last.tool_calls:  # the current turn: recorded, or still waiting
        record = view.results.get(call.id)
        if record is not None:
            steps.append(_step(run_id, record, returns, asked))
        else:
            steps.append(_waiting(run_id, call, view.turn, asked.get((view.turn, call.id))))
    return steps


def _step(
    run_id: str,
    record: ToolCallRecord,
    returns: dict[str, ToolReturn],
    asked: dict[tuple[int, str], AnsweredRow],
) -> dict[str, Any]:
    """One executed call, with what the model was given; ``declined``: its request was
    refused or expired (the model saw ``declined/expired``)."""
    given = returns.get(record.call.id)
    step: dict[str, Any] = {
        "id": record.call.id,
        "name": record.call.name,
        "arguments": record.call.arguments,
        "output": given.output if given is not None else record.result.output,
        "is_error": given.is_error if given is not None else record.result.is_error,
        "declined": record.answered_ok is False,
        "turn": record.turn,
    }
    if record.changed_arguments is not None:  # a hook or the approver changed them
        step["changed_arguments"] = record.changed_arguments
    row = asked.get((record.turn, record.call.id))
    request = record.request or (row.request if row is not None else None)
    if request is not None:
        step["request"] = shown(request, run_id=run_id)
        answer = _answer(row)
        if answer is None and record.answered_ok is False:
            answer = {"ok": False, "reason": "expired"}  # it expired where the run was parked
        if answer is not None:
            step["answer"] = answer
    return step


def _waiting(run_id: str, call: ToolCall, turn: int, row: AnsweredRow | None) -> dict[str, Any]:
    """A call of the current turn with no result yet: running, or waiting for its answer."""
    step: dict[str, Any] = {
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "output": None,
        "is_error": False,
        "declined": False,
        "turn": turn,
    }
    if row is not None:
        step["request"] = shown(row.request, run_id=run_id)
        answer = _answer(row)
        if answer is not None:
            step["answer"] = answer
            step["declined"] = not answer["ok"]
    return step


def _answer(row: AnsweredRow | None) -> dict[str, Any] | None:
    """What became of a request: its answer, when and through which worker; or its expiry."""
    if row is None:
        return None
    if row.answer is not None:
        return {
            "ok": row.answer.ok,
            "data": row.answer.data,
            "reason": row.answer.reason,
            "at": row.at,
            "worker": row.by,
        }
    if row.status == "expired":
        return {"ok": False, "data": None, "reason": "expired", "at": None, "worker": None}
    return None


class ServeInbox(Inbox):
    """The app's :class:`Inbox`: parks each run's requests until an answer comes, or
    ``park_timeout`` seconds (then the run halts and waits in the store)."""

    def __init__(self, park_timeout: float) -> None:
        super().__init__(park_timeout=park_timeout)


async def drive(begun: BegunRun) -> None:
    """Run a run begun here to its end or halt; what happens is kept in the store, which
    tells the event stream. A failure is the store's to record (the host does)."""
    try:
        await begun.run()
    except LeaseLostError:
        log.warning("run %s went on on another worker (this one lost its lease)", begun.run_id)
    except Exception as exc:
        log.warning("run %s failed: %r", begun.run_id, exc)
