"""Where a halted transcript stands: the last assistant turn and what became of its calls.

Rule of this module: a halted run is told by its transcript alone (an assistant turn whose
tool calls are not all answered); :class:`HaltedTurn` reads that, and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .errors import UsageError
from .messages import AssistantMessage, Message, ToolCall, ToolReturn

__all__ = ("HaltedTurn",)


@attrs.frozen
class HaltedTurn:
    """Where a halted transcript stands: the last assistant turn and what became of its calls.

    ``completed`` holds the results the halted turn already has (never executed again);
    ``open`` the calls still waiting, in call order.
    """

    before: tuple[Message, ...]
    assistant: AssistantMessage
    completed: dict[str, ToolReturn]
    open: tuple[ToolCall, ...]

    @classmethod
    def of(cls, messages: Sequence[Message]) -> HaltedTurn:
        """Split a halted transcript; :class:`UsageError` when it is not one."""
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if isinstance(message, ToolReturn):
                continue
            if not isinstance(message, AssistantMessage) or not message.tool_calls:
                break
            returns = [m for m in messages[index + 1 :] if isinstance(m, ToolReturn)]
            ids = {c.id for c in message.tool_calls}
            completed = {r.call_id: r for r in returns if r.call_id in ids}
            if len(completed) != len(returns):
                break
            still = tuple(c for c in message.tool_calls if c.id not in completed)
            if not still:
                break
            return cls(tuple(messages[:index]), message, completed, still)
        raise UsageError(
            "this transcript is not a halted run: it must end with an assistant turn whose "
            "tool calls are not all answered"
        )
