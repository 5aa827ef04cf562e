"""OpenTelemetry spans of a traced client's runs, on the GenAI semantic conventions.

Imported only when a client is built with ``tracing=Tracing(...)`` (it needs
``opentelemetry-api``); the engine then hands its runs, its model and each turn's toolkit
and waits to a :class:`RunTracer`, and an untraced client never meets this module.

Rules of this module:

- One ``invoke_agent`` span per drive of a run (a new run or a resume), made current while
  the run goes, so that every other span of the run is its child: ``chat {model}`` per model
  request (each retry its own), ``execute_tool {name}`` per execution of a tool, ``wait
  {kind}`` per wait for a person (:mod:`.otel_waits`). Names and attributes are the GenAI
  conventions' (``gen_ai.*``, ``error.type``); what they have no name for is under
  ``toolnexus.*``.
- A run carries its trace context (``RunLoop.trace``, kept in every result and so in a
  stored run): a resumed run's ``invoke_agent`` is a child of the halted one's, in the same
  trace, whichever process resumes it; the span that was current where it was resumed is
  linked. The wait of a call answered while the run was halted is a span from when its
  request was raised to when it was answered: the times its store kept (a durable
  resume's ``ResumePlan.waited``), else ``suspended_at`` in the trace context (stamped
  as it happens) to the resume; an instant when neither is known.
- Contents (messages, tool arguments and results, what a person is asked) only when
  :meth:`Tracing.captures_content`; the API key and header values never: nothing here
  reads them, and a provider's error is recorded as the scrubbed exception the model
  raised.
- Tracing never breaks a run: spans are ended on every path, and an exception is recorded
  and raised on unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._core.errors import UsageError
from .._core.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    SystemMessage,
    ToolReturn,
    UserMessage,
    raw_of,
)
from .._core.results import RunResult
from .._core.types import ToolContext, ToolResult, request_in
from .._core.version import __version__
from .otel_calls import TracedModel, TracedTools, failed
from .otel_waits import CARRIER, RAISED, SUSPENDED_AT, WaitSpans, suspended
from .tracing import Tracing, still_waited

if TYPE_CHECKING:
    from .engine import RunSpec
    from .model import Model

__all__ = ("RunTracer",)

_PROPAGATOR = TraceContextTextMapPropagator()
# gen_ai.provider.name by wire style; an in-process model is no provider the conventions know.
_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _same(text: str) -> str:
    return text


class RunTracer(WaitSpans):
    """What a traced engine hands its runs, model, tools and waits to."""

    def __init__(self, tracing: Tracing, style: str, model: Model) -> None:
        provider = tracing.tracer_provider
        if provider is not None and not callable(getattr(provider, "get_tracer", None)):
            raise UsageError(
                f"Tracing(tracer_provider=...) must be an OpenTelemetry TracerProvider, got "
                f"{type(provider).__name__}"
            )
        # Without a provider: the global one, followed even when it is set after this.
        self._tracer = (
            trace.get_tracer("toolnexus_async", __version__)
            if provider is None
            else provider.get_tracer("toolnexus_async", __version__)
        )
        self.content = tracing.captures_content()
        # What a provider sent may quote the key or a header value (an echo): captured
        # contents go through the model's scrubber, as its errors do.
        scrub = getattr(model, "scrub", None)
        self._scrub: Callable[[str], str] = scrub if callable(scrub) else _same
        common: dict[str, Any] = {
            "gen_ai.provider.name": _PROVIDERS.get(style, f"toolnexus.{style}"),
            "gen_ai.request.model": model.name,
        }
        url = getattr(model, "url", None)
        if isinstance(url, str):
            # The host and port only: a URL's credentials never reach a span.
            parts = urlsplit(url)
            if parts.hostname:
                common["server.address"] = parts.hostname
            port = parts.port or (443 if parts.scheme == "https" else 80)
            common["server.port"] = port
        self._common = common

    # -- a run -------------------------------------------------------------------------

    async def drive(
        self, spec: RunSpec, inner: Callable[[RunSpec], Awaitable[RunResult]]
    ) -> RunResult:
        """Drive ``spec`` through ``inner`` (the untraced engine) inside its run span."""
        loop = spec.loop
        stored = loop.trace
        parent = None
        links: list[Link] = []
        suspended_at: int | None = None
        if stored:
            # A resume: the halted run's span is the parent; the caller's, a link.
            parent = _PROPAGATOR.extract(stored)
            caller = trace.get_current_span().get_span_context()
            if caller.is_valid:
                links.append(Link(caller, {"toolnexus.link": "caller"}))
            at = stored.get(SUSPENDED_AT, "")
            suspended_at = int(at) if at.isdigit() else None
        span = self._tracer.start_span(
            "invoke_agent",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                **self._common,
                "toolnexus.run.id": loop.run_id,
                "toolnexus.run.resumed": spec.plan is not None or bool(stored),
            },
            links=links,
        )
        current = trace.set_span_in_context(span)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=current)
        loop.trace = carrier  # before the run keeps anything: every result carries it
        token = otel_context.attach(current)
        stamping = CARRIER.set(carrier)
        raised = RAISED.set(still_waited(spec.plan))
        try:
            if spec.plan is not None:
                self._answered_while_halted(spec.plan, suspended_at)
            result = await inner(spec)
        except BaseException as exc:
            RAISED.reset(raised)
            CARRIER.reset(stamping)
            otel_context.detach(token)
            failed(span, exc)
            span.end()
            raise
        RAISED.reset(raised)
        CARRIER.reset(stamping)
        otel_context.detach(token)
        usage = result.usage
        span.set_attributes(
            {
                "toolnexus.run.status": result.status,
                "toolnexus.run.turns": result.turns,
                "gen_ai.usage.input_tokens": usage.prompt_tokens,
                "gen_ai.usage.output_tokens": usage.completion_tokens,
            }
        )
        if result.model is not None:
            span.set_attribute("gen_ai.response.model", result.model)
        if result.status == "pending":
            requests = [r.request.id for r in result.suspended if r.request is not None]
            span.add_event("toolnexus.halted", {"toolnexus.request.ids": requests})
            if SUSPENDED_AT not in carrier:  # a request no traced step saw raised
                result = attrs.evolve(
                    result, trace_context={**carrier, SUSPENDED_AT: str(time.time_ns())}
                )
        span.end()
        return result

    # -- model requests ----------------------------------------------------------------

    def model(self, model: Model) -> Model:
        return TracedModel(model, self)

    def chat(self, model: str, messages: Sequence[Message]) -> Span:
        span = self._tracer.start_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={"gen_ai.operation.name": "chat", **self._common},
        )
        if self.content:
            span.set_attribute("gen_ai.input.messages", self._scrub(_json(_messages(messages))))
        return span

    def replied(self, span: Span, reply: ModelReply) -> None:
        usage = reply.usage
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
        }
        if usage.cache_read_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
        if usage.cache_write_tokens:
            attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
        if usage.reasoning_tokens:
            attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
        if reply.model is not None:
            attributes["gen_ai.response.model"] = reply.model
        if reply.stop_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = (reply.stop_reason,)
        raw = raw_of(reply)
        if isinstance(raw, dict) and isinstance(raw.get("id"), str):
            attributes["gen_ai.response.id"] = raw["id"]
        if self.content:
            output = _messages([reply.message])[0]
            if reply.stop_reason is not None:
                output["finish_reason"] = reply.stop_reason
            attributes["gen_ai.output.messages"] = self._scrub(_json([output]))
        span.set_attributes(attributes)
        span.end()

    # -- tool executions ---------------------------------------------------------------

    def tools(self, toolkit: Any) -> TracedTools:
        return TracedTools(toolkit, self)

    def executing(self, name: str, args: dict[str, Any], ctx: ToolContext | None) -> Span:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.type": "function",
        }
        if ctx is not None and ctx.call_id is not None:
            attributes["gen_ai.tool.call.id"] = ctx.call_id
        if self.content:
            attributes["gen_ai.tool.call.arguments"] = self._scrub(_json(args))
        return self._tracer.start_span(
            f"execute_tool {name}", kind=SpanKind.INTERNAL, attributes=attributes
        )

    def executed(
        self, span: Span, result: ToolResult, source: str, raised: BaseException | None
    ) -> None:
        """End ``span`` with how the execution went (``raised``: what the tool raised,
        which the model was told as text)."""
        request = request_in(result)
        attributes: dict[str, Any] = {"toolnexus.tool.source": source}
        if request is not None:
            suspended()
            attributes["toolnexus.tool.outcome"] = "pending"
            attributes["toolnexus.request.id"] = request.id
        elif result.is_error:
            attributes["toolnexus.tool.outcome"] = "error"
            if raised is not None:
                failed(span, raised)
            else:
                attributes["error.type"] = "tool_error"  # an error result, nothing raised
                span.set_status(Status(StatusCode.ERROR))
        else:
            attributes["toolnexus.tool.outcome"] = "ok"
        if self.content and request is None:
            attributes["gen_ai.tool.call.result"] = self._scrub(result.output)
        span.set_attributes(attributes)
        span.end()


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The transcript in the conventions' shape: a role and parts per message."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        if isinstance(message, ToolReturn):
            parts.append(
                {"type": "tool_call_response", "id": message.call_id, "response": message.output}
            )
            out.append({"role": "tool", "parts": parts})
            continue
        if isinstance(message, AssistantMessage):
            if message.text:
                parts.append({"type": "text", "content": message.text})
            parts.extend(
                {"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
                for c in message.tool_calls
            )
        elif isinstance(message, SystemMessage | UserMessage):
            parts.append({"type": "text", "content": message.text})
        out.append({"role": message.role, "parts": parts})
    return out
