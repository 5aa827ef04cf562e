"""The wait spans of a traced run: each wait for a person, live or answered while the run
was halted, and the moment a run's latest request was raised, kept in its trace context.

Rules of this module:

- A wait is a ``wait {kind}`` span (``toolnexus.*`` attributes: the request, the tool, the
  call, how it ended and how long it took), a child of the run's ``invoke_agent`` span. A
  request raised before this worker took the run over starts its span when it was raised.
- A wait that ended while the run was halted is a span from when its request was raised to
  when it was answered: the times its store kept (a durable resume's ``ResumePlan.waited``),
  else ``suspended_at`` in the trace context (stamped by :func:`suspended` as it happens)
  to the resume; an instant when neither is known.
- What a person is asked is captured only when the tracer captures contents, scrubbed.
- A mixin of :class:`~toolnexus_async._engine.otel.RunTracer`, which owns the tracer, its
  content setting and its scrubber, and sets :data:`CARRIER` and :data:`RAISED` around
  each drive.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, Tracer

from .._core.types import Answer, HaltRun, Request
from .tracing import resumed_wait

if TYPE_CHECKING:
    from .._core.messages import ToolCall
    from .._core.resume import ResumePlan

__all__ = ("CARRIER", "RAISED", "SUSPENDED_AT", "WaitSpans", "outcome_of", "suspended")

# When the run's latest request was raised (ns since the epoch): where the wait span of its
# resume begins.
SUSPENDED_AT = "suspended_at"
# The carrier of the run being driven, so that a suspension can stamp its time in it (the
# same dict the run's results carry, so the durable journal keeps it as it goes).
CARRIER: ContextVar[dict[str, str] | None] = ContextVar("toolnexus_trace_carrier", default=None)
# A resumed run's requests still waited for: when each was raised (ns, by request id).
RAISED: ContextVar[dict[str, int] | None] = ContextVar("toolnexus_wait_raised", default=None)


def suspended() -> None:
    """Stamp the run being driven with the time its latest request was raised."""
    carrier = CARRIER.get()
    if carrier is not None:
        carrier[SUSPENDED_AT] = str(time.time_ns())


def outcome_of(answer: Answer) -> str:
    """How a wait ended, said for its span."""
    if answer.ok:
        return "approved"
    return "expired" if answer.reason == "expired" else "declined"


class WaitSpans:
    """The wait spans of :class:`~toolnexus_async._engine.otel.RunTracer`."""

    _tracer: Tracer
    content: bool
    _scrub: Callable[[str], str]

    def _answered_while_halted(self, plan: ResumePlan, suspended_at: int | None) -> None:
        """A span for each wait that ended while the run was halted: from when its request
        was raised to when it was answered, with how. A stored run's plan says both, as its
        store kept them (``plan.waited``); else the wait runs from the run's
        ``suspended_at`` to now, and when neither says (a request kept by an earlier
        store) the span is an instant, with no ``toolnexus.wait.seconds``."""
        now = time.time_ns()
        calls = {call.id: call for call in plan.turn.assistant.tool_calls}
        for call_id, (request, answer) in plan.answers.items():
            start, end = resumed_wait(plan.waited.get(call_id), suspended_at, now)
            call = calls.get(call_id)
            span = self._tracer.start_span(
                f"wait {request.kind}",
                kind=SpanKind.INTERNAL,
                attributes={
                    **self._wait_attributes(request, call.name if call else "", call_id),
                    "toolnexus.wait.resumed": True,
                },
                start_time=now if start is None else start,
            )
            span.set_attribute("toolnexus.wait.outcome", outcome_of(answer))
            if start is not None:
                span.set_attribute("toolnexus.wait.seconds", (end - start) / 1e9)
            span.end(end_time=end)

    def _wait_attributes(self, request: Request, tool: str, call_id: str) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "toolnexus.request.id": request.id,
            "toolnexus.request.kind": request.kind,
            "toolnexus.tool.name": tool,
            "toolnexus.tool.call.id": call_id,
        }
        if request.expires_at is not None:
            attributes["toolnexus.request.expires_at"] = request.expires_at
        if self.content:
            attributes["toolnexus.request.prompt"] = self._scrub(request.prompt)
        return attributes

    async def wait(self, call: ToolCall, request: Request, asked: Awaitable[Answer]) -> Answer:
        """Await ``asked`` (a resolver's answer to ``request``) inside its wait span."""
        attributes = self._wait_attributes(request, call.name, call.id)
        started = time.perf_counter()
        since = (RAISED.get() or {}).get(request.id)
        if since is not None:  # raised before this worker took the run over
            now = time.time_ns()
            since = min(since, now)
            started -= (now - since) / 1e9
            attributes["toolnexus.wait.resumed"] = True
        span = self._tracer.start_span(
            f"wait {request.kind}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=since,
        )
        suspended()
        outcome = "unresolved"
        try:
            answer = await asked
        except HaltRun:
            outcome = "halted"  # the run halts on it; its resume continues the wait
            raise
        except BaseException as exc:
            if request.expired():
                outcome = "expired"  # the request's time limit cancelled the wait
            elif isinstance(exc, Exception):
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
            raise
        else:
            outcome = outcome_of(answer)
            if answer.reason is not None:
                span.set_attribute("toolnexus.answer.reason", answer.reason)
            return answer
        finally:
            span.set_attributes(
                {
                    "toolnexus.wait.outcome": outcome,
                    "toolnexus.wait.seconds": time.perf_counter() - started,
                }
            )
            span.end()
