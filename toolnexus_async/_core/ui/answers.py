"""From a front-end's reply to the one :class:`Answer` a request gets, and the checks before.

Rules of this module:

- Every protocol turns its replies into answers here, so that an approval, a decline, an
  edit or a question's answers mean the same whichever protocol brought them, and the
  same answer is built from the same reply every time: that is what lets a replayed reply
  be recognised (:func:`is_replay`) and change nothing.
- An approving answer names the call it approves (the request's ``data["digest"]``); edited
  arguments are taken only where the request allows them (``require_approval(...,
  editable=True)``), only as a JSON object, and only once the tool's own schema accepts
  them (``check``: ``Toolkit.check_arguments``). Anything else is a :class:`Refusal`, raised
  before any answer is handed over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import attrs

from ..types import Answer, Request
from .runs import Asked

__all__ = (
    "CheckArguments",
    "Refusal",
    "Resume",
    "Start",
    "approval",
    "is_replay",
    "reply",
    "taken",
)

# (tool name, arguments) -> what is wrong with them, or None: Toolkit.check_arguments.
CheckArguments = Callable[[str, dict[str, Any]], str | None]


class Refusal(Exception):
    """A reply that cannot be taken; its message says why (shown to the client)."""


@attrs.frozen
class Start:
    """Start a run with the thread's (the chat's) id and this prompt."""

    prompt: str


@attrs.frozen
class Resume:
    """Hand these answers over (none: each was a replay, or none was sent), then follow
    the run."""

    answers: tuple[Answer, ...]


def taken(row: Asked, answer: Answer, open_ids: set[str], now: datetime) -> Answer | None:
    """``answer`` if its request is open, None if the store took this very answer already
    (a replay); else the :class:`Refusal`: expired, answered otherwise, or gone."""
    rid = row.request.id
    # Expired where its run was parked, the store may not have heard of it: the clock says.
    if row.answer is None and (row.status == "expired" or row.request.expired(now)):
        raise Refusal(f"request {rid!r} expired at {row.request.expires_at}")
    if rid in open_ids:
        return answer
    if is_replay(row.answer, answer):
        return None
    if row.answer is not None:
        raise Refusal(f"request {rid!r} was answered already, otherwise")
    raise Refusal(f"request {rid!r} is no longer open (its run went on without it)")


def approval(
    request: Request,
    approved: bool,
    *,
    edited: object = None,
    note: str | None = None,
    check: CheckArguments | None = None,
) -> Answer:
    """The answer to an approval ``request``: approved as shown, approved with ``edited``
    arguments (a full replacement), or declined (``note``: the person's reason, kept in
    ``data``)."""
    data = request.data or {}
    if not approved:
        return Answer(request.id, False, {"note": note} if note else None, "declined")
    answer: dict[str, Any] = {}
    if isinstance(data.get("digest"), str):
        answer["digest"] = data["digest"]
    if edited is not None:
        if data.get("editable") is not True:
            raise Refusal(
                f"request {request.id!r} does not take edited arguments: approve it as "
                "shown, or decline it"
            )
        if not isinstance(edited, dict):
            raise Refusal(
                f"the edited arguments of request {request.id!r} must be a JSON object, "
                f"got {type(edited).__name__}"
            )
        tool = data.get("tool")
        if check is not None and isinstance(tool, str):
            wrong = check(tool, edited)
            if wrong is not None:
                raise Refusal(f"the edited arguments of request {request.id!r}: {wrong}")
        answer["arguments"] = edited
    return Answer(request.id, True, answer or None)


def reply(request: Request, payload: object) -> Answer:
    """The answer giving ``payload`` (a JSON object: a question's ``answers``, a form's
    fields) to a request that is not an approval."""
    questions = (request.data or {}).get("questions")
    asks = request.kind == "question" and isinstance(questions, list)
    if payload is None and not asks:
        return Answer(request.id, True)
    if not isinstance(payload, dict):
        raise Refusal(
            f"the answer to request {request.id!r} must be a JSON object, "
            f"got {type(payload).__name__}"
        )
    if asks:
        assert isinstance(questions, list)
        given = payload.get("answers")
        if not isinstance(given, list) or len(given) != len(questions):
            raise Refusal(
                f"the answer to request {request.id!r} must carry 'answers', a list of "
                f"{len(questions)} (one per question)"
            )
    return Answer(request.id, True, dict(payload))


def cancelled(request: Request) -> Answer:
    return Answer(request.id, False, reason="cancelled")


def is_replay(given: Answer | None, answer: Answer) -> bool:
    """Whether ``answer`` is the answer the store already took (a reply sent again)."""
    if given is None:
        return False
    return (given.ok, given.data or None, given.reason) == (
        answer.ok,
        answer.data or None,
        answer.reason,
    )


def response_schema(request: Request) -> dict[str, Any] | None:
    """The JSON Schema of what answers ``request``: an approval's ``approved`` (and
    ``editedArgs`` where it may be edited), a question's ``answers``, a form's own schema."""
    data: Mapping[str, Any] = request.data or {}
    if request.kind == "approval":
        properties: dict[str, Any] = {
            "approved": {"type": "boolean"},
            "reason": {"type": "string"},
        }
        if data.get("editable") is True:
            properties["editedArgs"] = {
                "type": "object",
                "description": "The arguments to run with instead: a full replacement.",
            }
        return {"type": "object", "properties": properties, "required": ["approved"]}
    questions = data.get("questions")
    if request.kind == "question" and isinstance(questions, list):
        count = len(questions)
        one = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        return {
            "type": "object",
            "properties": {
                "answers": {"type": "array", "items": one, "minItems": count, "maxItems": count}
            },
            "required": ["answers"],
        }
    schema = data.get("schema")
    return dict(schema) if isinstance(schema, dict) else None
