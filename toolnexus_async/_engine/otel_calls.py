"""The traced stand-ins a traced engine drives: a model whose every request is a ``chat``
span, and a run's toolkit whose every execution is an ``execute_tool`` span.

Rule of this module: each wraps what it stands in for and changes nothing of what passes
through; what a span says is :class:`~.otel.RunTracer`'s, and a failure or a cancellation
is recorded on its span by :func:`failed`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from .._core.messages import Message, ModelReply
from .._core.types import Tool, ToolContext, ToolResult
from .tracing import TOOL_FAILURE

if TYPE_CHECKING:
    from .._core.output import OutputSpec
    from .model import Model, OnArguments, OnText
    from .otel import RunTracer

__all__ = ("TracedModel", "TracedTools", "failed")


class TracedModel:
    """A model whose every request is a ``chat`` span."""

    __slots__ = ("_model", "_tracer", "enforces_timeout", "name")

    def __init__(self, model: Model, tracer: RunTracer) -> None:
        self._model = model
        self._tracer = tracer
        self.name = model.name
        self.enforces_timeout = model.enforces_timeout

    @property
    def url(self) -> str | None:
        url = getattr(self._model, "url", None)
        return url if isinstance(url, str) else None

    def request(
        self, messages: Sequence[Message], tools: Sequence[Tool], output: OutputSpec | None = None
    ) -> Awaitable[ModelReply]:
        asked = self._model.request(messages, tools, output)
        return self._in_span(messages, asked, streamed=False)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        on_text: OnText,
        on_reasoning: OnText | None = None,
        output: OutputSpec | None = None,
        on_output: OnArguments | None = None,
    ) -> ModelReply:
        asked = self._model.stream(messages, tools, on_text, on_reasoning, output, on_output)
        return await self._in_span(messages, asked, streamed=True)

    async def _in_span(
        self, messages: Sequence[Message], asked: Awaitable[ModelReply], streamed: bool
    ) -> ModelReply:
        """``asked`` (the model's request, not started yet), awaited inside its span."""
        span = self._tracer.chat(self.name, messages)
        if streamed:
            span.set_attribute("toolnexus.stream", True)
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                reply = await asked
        except BaseException as exc:
            failed(span, exc)
            span.end()
            raise
        self._tracer.replied(span, reply)
        return reply

    async def aclose(self) -> None:
        await self._model.aclose()


class TracedTools:
    """A run's toolkit, as its executor sees it, whose every execution is a span."""

    __slots__ = ("_toolkit", "_tracer")

    def __init__(self, toolkit: Any, tracer: RunTracer) -> None:
        self._toolkit = toolkit
        self._tracer = tracer

    async def execute(
        self, name: str, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> ToolResult:
        span = self._tracer.executing(name, args, ctx)
        # A tool that raises is told to the model as text; its span records why.
        raised: list[BaseException] = []
        recording = TOOL_FAILURE.set(raised.append)
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                result: ToolResult = await self._toolkit.execute(name, args, ctx)
        except BaseException as exc:
            failed(span, exc)
            span.end()
            raise
        finally:
            TOOL_FAILURE.reset(recording)
        tool = self._toolkit.get(name)
        source = tool.source if tool is not None else "unknown"
        self._tracer.executed(span, result, source, raised[0] if raised else None)
        return result

    def get(self, name: str) -> Tool | None:
        tool: Tool | None = self._toolkit.get(name)
        return tool

    def check_arguments(self, name: str, args: dict[str, Any]) -> str | None:
        problem: str | None = self._toolkit.check_arguments(name, args)
        return problem

    async def refused(self, name: str, args: dict[str, Any], ctx: ToolContext) -> None:
        await self._toolkit.refused(name, args, ctx)


def failed(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span``: an error, or a cancellation (no error status)."""
    if isinstance(exc, Exception):
        span.record_exception(exc)
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
    else:
        span.set_attribute("toolnexus.cancelled", True)
