"""A model played by a Python function (``LlmClient.in_process``): no HTTP, no key.

Rule of this module, as of ``model``'s: it turns a transcript and the tools' specs into one
:class:`~toolnexus_async._core.loop.ModelReply`, and keeps no state between requests. The
function gets copies, so it may keep or change what it is given without touching the run.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from .._core.errors import ProtocolError
from .._core.hotjson import compact
from .._core.messages import AssistantMessage, Message, ModelReply
from .._core.output import OUTPUT_TOOL, OutputSpec
from .._core.types import Tool
from .model import Generate, OnArguments, OnText

__all__ = ("FunctionModel",)


class FunctionModel:
    """A model played by a Python function: ``generate(messages, tools)`` returns one reply.

    The reply may be an :class:`AssistantMessage`, a plain string (a final text), or a full
    ``ModelReply`` when the function wants to report usage.
    """

    __slots__ = ("_generate", "name")

    enforces_timeout = False

    def __init__(self, generate: Generate, model: str) -> None:
        self._generate = generate
        self.name = model

    async def request(
        self, messages: Sequence[Message], tools: Sequence[Tool], output: OutputSpec | None = None
    ) -> ModelReply:
        # A copy: the function may keep or mutate what it gets without touching the run.
        reply: object = self._generate(list(messages), list(tools))
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, ModelReply):
            return reply
        if isinstance(reply, AssistantMessage):
            return ModelReply(reply, model=self.name, raw=reply)
        if isinstance(reply, str):
            return ModelReply(AssistantMessage(reply), model=self.name, raw=reply)
        raise ProtocolError(
            f"in-process model {self.name!r} returned {type(reply).__name__}; "
            "return an AssistantMessage, a ModelReply or a str"
        )

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        on_text: OnText,
        on_reasoning: OnText | None = None,
        output: OutputSpec | None = None,
        on_output: OnArguments | None = None,
    ) -> ModelReply:
        """The function's reply; its reasoning, text and output tool's arguments are
        handed over in one piece each."""
        reply = await self.request(messages, tools)
        if on_reasoning is not None:
            for thought in reply.message.reasoning:
                if thought.text:
                    on_reasoning(thought.text)
        if reply.message.text:
            on_text(reply.message.text)
        if on_output is not None:
            for index, call in enumerate(reply.message.tool_calls):
                if call.name == OUTPUT_TOOL:
                    on_output(call.invalid_arguments or compact(call.arguments), index)
        return reply

    async def aclose(self) -> None:
        return None
