"""One executed tool call's record (:class:`ToolCallRecord`) and its JSON form.

Rule of this module: a record is a frozen value made by the loop as each call's outcome
comes in, and its JSON form (``record_to_json``/``record_from_json``) is the one a run's
(``results.py``) and a stored run's rows carry, so it reads back equal.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from .errors import PayloadError
from .fastinit import fast_init
from .messages import ToolCall, call_from_json, call_to_json
from .types import Request, ToolResult

__all__ = ("ToolCallRecord", "record_from_json", "record_to_json")


@fast_init
@attrs.frozen
class ToolCallRecord:
    """One executed tool call: what the model asked, what came back, and in which turn.

    ``request`` is the suspension the call raised, if any; ``answered_ok`` says how the
    host answered it (``None`` when it was not answered).

    ``arguments`` are always the model's. ``changed_arguments`` are those the tool was given
    instead, when a ``before_tool`` hook or an approver (``require_approval(...,
    editable=True)``) changed them; ``None`` when the tool got the model's. Both are kept,
    so the history shows what was asked and what ran.
    """

    call: ToolCall
    result: ToolResult
    turn: int
    request: Request | None = None
    answered_ok: bool | None = None
    changed_arguments: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.call.id

    @property
    def name(self) -> str:
        return self.call.name

    @property
    def arguments(self) -> dict[str, Any]:
        return self.call.arguments


def _result_to_json(result: ToolResult) -> dict[str, Any]:
    out: dict[str, Any] = {"output": result.output, "is_error": result.is_error}
    meta = dict(result.metadata or {})
    pending = meta.pop("pending", None)
    if isinstance(pending, Request):
        out["pending"] = pending.to_dict()
    elif pending is not None:
        meta["pending"] = pending
    if meta:
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"tool result metadata is not JSON: {exc}") from None
        out["metadata"] = meta
    return out


def _result_from_json(item: object, where: str) -> ToolResult:
    if not isinstance(item, dict):
        raise PayloadError(f"{where} must be an object")
    output, is_error = item.get("output"), item.get("is_error")
    if not isinstance(output, str) or not isinstance(is_error, bool):
        raise PayloadError(f"{where} needs a string 'output' and a bool 'is_error'")
    meta = item.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise PayloadError(f"{where}.metadata must be an object")
    meta = dict(meta) if meta else {}
    if "pending" in item:
        meta["pending"] = Request.from_dict(item["pending"])
    return ToolResult(output, is_error, meta or None)


def record_to_json(record: ToolCallRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "call": call_to_json(record.call),
        "result": _result_to_json(record.result),
        "turn": record.turn,
    }
    if record.request is not None:
        out["request"] = record.request.to_dict()
    if record.answered_ok is not None:
        out["answered_ok"] = record.answered_ok
    if record.changed_arguments is not None:
        out["changed_arguments"] = record.changed_arguments
    return out


def record_from_json(item: object, where: str) -> ToolCallRecord:
    if not isinstance(item, dict):
        raise PayloadError(f"{where} must be an object")
    turn = item.get("turn")
    if not isinstance(turn, int) or isinstance(turn, bool):
        raise PayloadError(f"{where}.turn must be an integer")
    answered = item.get("answered_ok")
    if answered is not None and not isinstance(answered, bool):
        raise PayloadError(f"{where}.answered_ok must be a bool")
    request = item.get("request")
    changed = item.get("changed_arguments")
    if changed is not None and not isinstance(changed, dict):
        raise PayloadError(f"{where}.changed_arguments must be an object")
    return ToolCallRecord(
        call_from_json(item.get("call"), f"{where}.call"),
        _result_from_json(item.get("result"), f"{where}.result"),
        turn,
        Request.from_dict(request) if request is not None else None,
        answered,
        changed,
    )
