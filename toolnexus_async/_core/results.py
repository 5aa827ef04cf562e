"""What a run hands back: its status, transcript, tool calls and token usage.

Rule of this module: results are frozen values built once, by the loop, when a run ends,
and a run's JSON form (``to_dict``/``from_dict``) carries everything needed to resume it in
another process. The record of each tool call in it, and that record's JSON form, are
``records.py``'s (re-exported here).
"""

from __future__ import annotations

import json
from typing import Any, Generic, Literal

import attrs
from typing_extensions import TypeVar

from . import output as _output
from .errors import PayloadError
from .fastinit import fast_init
from .messages import (
    ZERO_USAGE,
    Message,
    ToolCall,
    Usage,
    messages_from_json,
    messages_to_json,
)
from .records import ToolCallRecord, record_from_json, record_to_json
from .types import Request, ToolResult

__all__ = ("OutputT", "RunResult", "ToolCallRecord", "record_from_json", "record_to_json")

RunStatus = Literal["done", "pending", "incomplete"]
# The type of a run's validated output (RunResult[Order]); Any for a run without one.
OutputT = TypeVar("OutputT", default=Any)


@fast_init
@attrs.frozen
class RunResult(Generic[OutputT]):
    """The outcome of :meth:`LlmClient.run`.

    Attributes:
        status: ``"done"`` (the model answered), ``"pending"`` (a tool suspended and no
            ``wait_for`` was set) or ``"incomplete"`` (a limit stopped the run).
        text: the model's last text (empty when it said none).
        pending: the :class:`Request` of the first suspended call in tool-call order, only
            when ``status == "pending"``.
        messages: the whole provider-neutral transcript, history included.
        tool_calls: every executed call, in order.
        turns: model requests made.
        usage: tokens summed across turns.
        model: the model that answered last (as the provider reported it).
        limit: which limit stopped an ``"incomplete"`` run, e.g. ``"max_turns"``.
        suspended: for a ``"pending"`` run, every suspended call of the halted turn with
            its request, in call order (``pending`` is the first of them).
        run_id: the run's id, kept across halts and resumes.
        style: the wire style that ran it (``"openai"``, ``"anthropic"``, ``"gemini"``,
            ``"in-process"``).
        refusal: the model's refusal, when its last reply declined to answer (OpenAI's
            ``message.refusal``); ``text`` is then empty. ``None`` otherwise.
        trace_context: for a traced run (``LlmClient(tracing=Tracing())``), its trace
            context (the W3C ``traceparent``, a ``tracestate`` if any, and ``suspended_at``,
            nanoseconds since the epoch, when its latest request was raised), so that
            resuming it, in any process, continues its trace. ``None`` for a run that was
            not traced.
        output: the validated value of a run given ``output_type=``, built as that type
            (``None`` until the run is ``"done"``, and after a refusal). A run read back
            from its JSON form has the JSON value here, unless resumed with the type. A
            run without an output type (a ``RunResult[str]``) has its ``text`` here once
            it is ``"done"``.
        output_data: the validated JSON ``output`` was built from (``None`` for a run
            without an output type).
        output_spec: the run's :class:`OutputSpec` (schema and method), kept across halts.
        output_retries_used: how many invalid replies were sent back to be corrected so
            far; kept across halts, so a resumed run has only the rest of
            ``output_spec.retries`` left.
    """

    status: RunStatus
    text: str
    messages: tuple[Message, ...]
    tool_calls: tuple[ToolCallRecord, ...] = ()
    turns: int = 0
    usage: Usage = ZERO_USAGE
    model: str | None = None
    pending: Request | None = None
    limit: str | None = None
    suspended: tuple[ToolCallRecord, ...] = ()
    run_id: str = ""
    style: str | None = None
    refusal: str | None = None
    trace_context: dict[str, str] | None = None
    output: OutputT | None = None
    output_data: Any = None
    output_spec: _output.OutputSpec | None = None
    output_retries_used: int = 0

    @property
    def output_method(self) -> str | None:
        """How the model was asked for the output: ``"native"``, ``"tool"`` or
        ``"prompt"``; ``None`` for a run without an output type."""
        return self.output_spec.method if self.output_spec is not None else None

    @property
    def declined(self) -> tuple[Request, ...]:
        """The requests answered with ``ok=False`` (declined, cancelled or expired), in call
        order. A run can be ``"done"`` with some: the model was told, and went on without.
        Empty when every request was approved (or none was asked)."""
        return tuple(
            c.request for c in self.tool_calls if c.request is not None and c.answered_ok is False
        )

    @property
    def approved(self) -> tuple[Request, ...]:
        """The requests answered with ``ok=True``, in call order."""
        return tuple(c.request for c in self.tool_calls if c.request is not None and c.answered_ok)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form: status, style, model, transcript, turns, usage, every
        tool call, and every outstanding suspended call of a halted turn (call id, tool,
        arguments and its request). ``RunResult.from_dict(r.to_dict()) == r``.

        Raises:
            PayloadError: a tool result's metadata is not JSON.
        """
        return run_to_dict(self)

    @classmethod
    def from_dict(cls, payload: object) -> RunResult:
        """Rebuild a run from :meth:`to_dict`'s form (a dict, or its JSON text).

        Raises:
            PayloadError: the payload is malformed; the message names what is wrong.
        """
        return run_from_dict(payload)


# Version 2: the transcript may carry reasoning. Version 1 runs read unchanged.
RUN_VERSION = 2
_RUN_READS = (1, 2)
_USAGE_PARTS = ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


def run_to_dict(run: RunResult) -> dict[str, Any]:
    """The versioned JSON form of a run (see :meth:`RunResult.to_dict`)."""
    out: dict[str, Any] = {
        "version": RUN_VERSION,
        "run_id": run.run_id,
        "status": run.status,
        "text": run.text,
        "style": run.style,
        "model": run.model,
        "turns": run.turns,
        "usage": run.usage.to_dict(),
        "limit": run.limit,
        "refusal": run.refusal,
        # Kept only when the run has an output type: the JSON of other runs is unchanged.
        **(
            {
                "output_spec": run.output_spec.to_dict(),
                "output": run.output_data,
                "output_retries_used": run.output_retries_used,
            }
            if run.output_spec is not None
            else {}
        ),
        "messages": messages_to_json(run.messages)["messages"],
        "tool_calls": [record_to_json(r) for r in run.tool_calls],
        "pending": run.pending.to_dict() if run.pending is not None else None,
        "suspended": [
            {
                "call_id": r.call.id,
                "tool": r.call.name,
                "arguments": r.call.arguments,
                "turn": r.turn,
                "request": r.request.to_dict() if r.request is not None else None,
            }
            for r in run.suspended
        ],
    }
    if run.trace_context is not None:
        # Only for a traced run: untraced runs keep the form older releases wrote and read.
        out["trace_context"] = dict(run.trace_context)
    return out


def _int(payload: dict[str, Any], key: str) -> int:
    value = payload.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PayloadError(f"run {key!r} must be an integer")
    return value


def _opt_str(payload: dict[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is not None and not isinstance(value, str):
        raise PayloadError(f"run {key!r} must be a string or null")
    return value


def run_from_dict(payload: object) -> RunResult:
    """Rebuild a run from :func:`run_to_dict`'s form; :class:`PayloadError` names the fault."""
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except ValueError as exc:
            raise PayloadError(f"run is not valid JSON: {exc}") from None
        except RecursionError:
            raise PayloadError("run JSON is nested too deeply to read") from None
    if not isinstance(payload, dict):
        raise PayloadError("a run must be a JSON object")
    version = payload.get("version")
    if isinstance(version, bool) or version not in _RUN_READS:
        raise PayloadError(
            f"run version {version!r} is not supported (this release reads versions "
            f"{' and '.join(map(str, _RUN_READS))})"
        )
    status = payload.get("status")
    if status not in ("done", "pending", "incomplete"):
        raise PayloadError(f"run status {status!r} is not done, pending or incomplete")
    text = payload.get("text")
    if not isinstance(text, str):
        raise PayloadError("run 'text' must be a string")
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        raise PayloadError("run 'usage' must be an object")
    messages = messages_from_json({"version": version, "messages": payload.get("messages")})
    records = payload.get("tool_calls")
    if not isinstance(records, list):
        raise PayloadError("run 'tool_calls' must be a list")
    tool_calls = tuple(record_from_json(r, f"tool_calls[{i}]") for i, r in enumerate(records))
    raw_suspended = payload.get("suspended")
    if not isinstance(raw_suspended, list):
        raise PayloadError("run 'suspended' must be a list")
    suspended = []
    for i, item in enumerate(raw_suspended):
        where = f"suspended[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
            raise PayloadError(f"{where} must be an object with a 'request'")
        request = Request.from_dict(item["request"])
        arguments = item.get("arguments")
        if not isinstance(arguments, dict):
            raise PayloadError(f"{where}.arguments must be an object")
        call = ToolCall(_req_str(item, "call_id", where), _req_str(item, "tool", where), arguments)
        turn = item.get("turn")
        if not isinstance(turn, int) or isinstance(turn, bool):
            raise PayloadError(f"{where}.turn must be an integer")
        suspended.append(ToolCallRecord(call, ToolResult.pending(request), turn, request))
    pending = payload.get("pending")
    spec = payload.get("output_spec")
    output_spec = _output.OutputSpec.from_dict(spec) if spec is not None else None
    if output_spec is not None:
        output = payload.get("output")
    else:  # a run without an output type: a done run's text is its output
        refusal = _opt_str(payload, "refusal")
        output = text if status == "done" and refusal is None else None
    # Absent from runs stored before it was kept: they had used none, as far as we know.
    used = _int(payload, "output_retries_used") if "output_retries_used" in payload else 0
    return RunResult(
        status=status,
        text=text,
        messages=tuple(messages),
        tool_calls=tool_calls,
        turns=_int(payload, "turns"),
        usage=Usage(
            _int(usage, "prompt_tokens"),
            _int(usage, "completion_tokens"),
            _int(usage, "total_tokens"),
            # Absent from runs stored before these were counted.
            *(_int(usage, key) if key in usage else 0 for key in _USAGE_PARTS),
        ),
        model=_opt_str(payload, "model"),
        pending=Request.from_dict(pending) if pending is not None else None,
        limit=_opt_str(payload, "limit"),
        suspended=tuple(suspended),
        run_id=_opt_str(payload, "run_id") or "",
        style=_opt_str(payload, "style"),
        refusal=_opt_str(payload, "refusal"),  # absent from runs stored before it existed
        trace_context=_trace_context(payload.get("trace_context")),
        output=output,
        output_data=output if output_spec is not None else None,
        output_spec=output_spec,
        output_retries_used=used,
    )


def _trace_context(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError("run 'trace_context' must be an object of strings")
    return dict(value)


def _req_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise PayloadError(f"{where}.{key} must be a string")
    return value
