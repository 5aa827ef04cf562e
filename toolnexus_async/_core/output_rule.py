"""Rule 7 of the run loop: what a model's reply means for a run with a typed output.

Rule of this module: it only judges. :func:`judge_reply` reads one reply against the run's
:class:`OutputSpec` and says what it settled; the loop (``_core/loop.py``) acts on that
(ends the run, or asks the model again within its retries). No state, no I/O.

- A refusal without tool calls ends the run ``"done"`` with no output; it is never read as
  an invalid reply.
- With the ``"tool"`` method, the call of the output tool is the answer. Every call of that
  reply is answered in the transcript (so it stays paired): the output tool's with
  "accepted" or the errors, the others as not run. A reply that calls other tools (or
  paused) and not the output tool settles nothing: the model works with its tools first.
- With the other methods, the final reply's text is read; a reply with tool calls (or
  one that paused) settles nothing.
"""

from __future__ import annotations

import json
from typing import Any

from .messages import AssistantMessage, ToolReturn
from .output import OUTPUT_TOOL, OutputSpec

__all__ = ("NOT_RUN", "Verdict", "judge_reply")

# The result of a call made in the same reply as the output tool's: it was not run.
NOT_RUN = "not run: this reply gave the final result"


class Verdict:
    """What a reply settled: the output ``(value, data)`` (``error`` None; ``(None, None)``
    for a refusal), or an ``error`` with the ``raw`` text it was read from. ``answered``:
    the tool results the transcript gains (the output tool's method); when there are
    some, the errors were told the model there."""

    __slots__ = ("answered", "error", "output", "raw")

    def __init__(
        self,
        *,
        output: tuple[Any, Any] = (None, None),
        error: str | None = None,
        raw: str = "",
        answered: tuple[ToolReturn, ...] = (),
    ) -> None:
        self.output = output
        self.error = error
        self.raw = raw
        self.answered = answered


def judge_reply(
    spec: OutputSpec, message: AssistantMessage, stop_reason: str | None
) -> Verdict | None:
    """The verdict on ``message`` (see the module rules); None when it settled nothing."""
    if message.refusal is not None or stop_reason == "refusal":
        return None if message.tool_calls else Verdict()
    if spec.method != "tool":
        if message.tool_calls or stop_reason == "pause_turn":
            return None
        raw = message.text or ""
        value, data, error = spec.read_text(raw)
        return Verdict(output=(value, data), error=error, raw=raw)
    found = next((c for c in message.tool_calls if c.name == OUTPUT_TOOL), None)
    if found is None:
        if message.tool_calls or stop_reason == "pause_turn":
            return None
        return Verdict(
            error=f"the reply must call the {OUTPUT_TOOL} tool with the answer",
            raw=message.text or "",
        )
    raw = found.invalid_arguments or json.dumps(found.arguments)
    if found.invalid_arguments is not None:
        value, data, error = None, None, "its arguments are not a JSON object"
    else:
        value, data, error = spec.accept(found.arguments)
    answered = tuple(
        ToolReturn(
            call.id,
            call.name,
            (spec.feedback(error) if error else "Final result accepted."),
            bool(error),
        )
        if call is found
        else ToolReturn(call.id, call.name, NOT_RUN, True)
        for call in message.tool_calls
    )
    return Verdict(output=(value, data), error=error, raw=raw, answered=answered)
