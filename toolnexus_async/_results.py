"""What a run hands back: its status, transcript, tool calls and token usage.

Rule of this module: results are frozen values built once, by the loop, when a run ends.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ._messages import Message, ToolCall
from ._types import Request, ToolResult

__all__ = ("RunResult", "ToolCallRecord", "Usage")

RunStatus = Literal["done", "pending", "incomplete"]


@attrs.frozen
class Usage:
    """Tokens counted by the provider, summed over the turns of a run.

    Anthropic's ``input_tokens``/``output_tokens`` are mapped to the prompt/completion pair.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        """The OpenAI-style keys, as plain ints."""
        return attrs.asdict(self)


@attrs.frozen
class ToolCallRecord:
    """One executed tool call: what the model asked, what came back, and in which turn.

    ``request`` is the suspension the call raised, if any; ``answered_ok`` says how the
    host answered it (``None`` when it was not answered).
    """

    call: ToolCall
    result: ToolResult
    turn: int
    request: Request | None = None
    answered_ok: bool | None = None

    @property
    def id(self) -> str:
        return self.call.id

    @property
    def name(self) -> str:
        return self.call.name

    @property
    def arguments(self) -> dict[str, Any]:
        return self.call.arguments


@attrs.frozen
class RunResult:
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
    """

    status: RunStatus
    text: str
    messages: tuple[Message, ...]
    tool_calls: tuple[ToolCallRecord, ...] = ()
    turns: int = 0
    usage: Usage = attrs.field(factory=Usage)
    model: str | None = None
    pending: Request | None = None
    limit: str | None = None
    suspended: tuple[ToolCallRecord, ...] = ()
