"""Public fakes for testing code that uses toolnexus_async, without a network or a key.

``ScriptedModel`` plays a model for :meth:`LlmClient.in_process`: it returns the replies
it was given, in order, and records every transcript it was sent::

    model = ScriptedModel(
        reply(tool_call("add", {"a": 1, "b": 2}, id="c1")),
        "The sum is 3.",
    )
    client = LlmClient.in_process(model)
    result = await client.run("add 1 and 2", toolkit)
    assert model.requests[1][-1] == ToolReturn("c1", "add", "3")

A reply may also be a function of the transcript, for a model that reacts to what it sees.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from ._messages import AssistantMessage, Message, ToolCall
from ._types import Tool

__all__ = ("ScriptedModel", "reply", "tool_call")

_ids = itertools.count(1)

Scripted = AssistantMessage | str | Callable[[list[Message]], AssistantMessage | str]


def tool_call(
    name: str, arguments: Mapping[str, Any] | None = None, *, id: str | None = None
) -> ToolCall:
    """A tool call as a model would send it; ids are generated unless given."""
    return ToolCall(id or f"call_{next(_ids)}", name, dict(arguments or {}))


def reply(*parts: str | ToolCall | None) -> AssistantMessage:
    """An assistant message: its strings are the text, its ``ToolCall``s the calls.

    ``None`` parts are ignored, so ``reply(None, call)`` is the same as ``reply(call)``.
    """
    texts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, ToolCall):
            calls.append(part)
        elif part is not None:
            raise TypeError(f"reply() takes strings and ToolCalls, not {type(part).__name__}")
    return AssistantMessage("".join(texts) if texts else None, tuple(calls))


class ScriptedModel:
    """A ``generate`` function for :meth:`LlmClient.in_process` that follows a script."""

    def __init__(self, *replies: Scripted) -> None:
        self._replies = list(replies)
        self.requests: list[list[Message]] = []
        self.tools_seen: list[list[str]] = []

    @property
    def remaining(self) -> int:
        """Replies not yet played."""
        return len(self._replies) - len(self.requests)

    async def __call__(self, messages: list[Message], tools: list[Tool]) -> AssistantMessage | str:
        index = len(self.requests)
        self.requests.append(messages)
        self.tools_seen.append([t.name for t in tools])
        if index >= len(self._replies):
            raise AssertionError(
                f"ScriptedModel was asked for reply {index + 1} but has only {len(self._replies)}"
            )
        scripted = self._replies[index]
        return scripted(messages) if callable(scripted) else scripted
