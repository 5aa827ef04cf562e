"""Tracing's switch, where a resumed wait's span lies, and what a run tells the log when a
tool raises.

Rules of this module:

- It never imports OpenTelemetry: :class:`Tracing` is only a value (which provider, whether
  message contents are captured); the spans are made by ``otel``, imported when a client
  is built with ``tracing=``. Without it nothing here costs a run anything.
- A tool that raises is logged once, with its traceback, on the ``toolnexus_async``
  logger, at WARNING: the run goes on (the model is told), but a person should see why.
  The record carries the run's id as ``record.run_id`` (as every record logged in the
  course of a run does), and when the call is traced the exception is recorded on its
  ``execute_tool`` span too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import attrs

from .._core.errors import UsageError

if TYPE_CHECKING:
    from .._core.resume import ResumePlan

__all__ = (
    "CONTENT_ENV",
    "Tracing",
    "otel_missing",
    "require_otel",
    "resumed_wait",
    "still_waited",
    "run_extra",
    "tool_raised",
)

log = logging.getLogger("toolnexus_async")

#: The GenAI conventions' switch for capturing message contents on spans.
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# What turns it on: a truthy word, or one of the conventions' span modes.
_CONTENT_ON = {"true", "1", "yes", "span_only", "span_and_event"}

# Set by a traced call while its tool runs: records an exception on the call's span.
TOOL_FAILURE: ContextVar[Callable[[BaseException], None] | None] = ContextVar(
    "toolnexus_tool_failure", default=None
)


def _check_capture(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise UsageError(f"Tracing(capture_content=...) must be True, False or None, got {value!r}")


@attrs.frozen
class Tracing:
    """OpenTelemetry traces for a client's runs: ``LlmClient(..., tracing=Tracing())``.

    Needs ``opentelemetry-api`` (the extra ``[otel]``); the spans go
    wherever the tracer provider sends them. Every run is an ``invoke_agent`` span, each
    model request a ``chat {model}`` span, each tool execution an ``execute_tool {name}``
    span and each wait for a person a ``wait {kind}`` span (see docs/observability.md).

    Args:
        tracer_provider: the OpenTelemetry ``TracerProvider`` to use; ``None``: the global
            one (``opentelemetry.trace.set_tracer_provider``), looked up at each span.
        capture_content: put message contents on the spans (prompts, replies, tool
            arguments and results, what a person is asked). ``None``: as the environment
            variable ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (``true``
            or ``SPAN_ONLY`` turn it on); off by default. The API key and header values
            are never on a span, whatever this says.
    """

    tracer_provider: Any = None
    capture_content: bool | None = attrs.field(default=None, validator=_check_capture)

    def captures_content(self) -> bool:
        """Whether message contents go on the spans (the option, else the environment)."""
        if self.capture_content is not None:
            return self.capture_content
        return os.environ.get(CONTENT_ENV, "").strip().lower() in _CONTENT_ON


def otel_missing(exc: ImportError, what: str = "tracing=Tracing()") -> UsageError:
    """The error for ``what`` (a switch that turns tracing on) where the API is missing."""
    return UsageError(
        f"{what} needs OpenTelemetry's API ({exc}): pip install -e '.[otel]' "
        f"in the toolnexus-async checkout (or pip install 'opentelemetry-api>=1.30')"
    )


def require_otel(what: str = "tracing=Tracing()") -> None:
    """Raise :func:`otel_missing` now, rather than when the first client is built (a
    server builds its client once it serves), if OpenTelemetry's API cannot be imported."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError as exc:
        raise otel_missing(exc, what) from None


def resumed_wait(
    stored: tuple[float, float | None] | None, suspended_at: int | None, now: int
) -> tuple[int | None, int]:
    """Where a resumed wait's span starts and ends (ns since the epoch): the stored raise
    and answer times when the store kept them, else the run's ``suspended_at`` and now.
    Neither in the future (another worker's clock may run ahead); ``None``: not known."""
    if stored is not None:
        raised, answered = stored
        start = min(int(raised * 1e9), now)
        end = now if answered is None else min(max(int(answered * 1e9), start), now)
        return start, end
    if suspended_at is not None and suspended_at <= now:
        return suspended_at, now
    return None, now


def still_waited(plan: ResumePlan | None) -> dict[str, int] | None:
    """The requests ``plan`` waits for again whose raise time the store kept (ns, by id)."""
    if plan is None or not plan.waiting:
        return None
    return {
        request.id: int(plan.waited[call_id][0] * 1e9)
        for call_id, request in plan.waiting.items()
        if call_id in plan.waited
    }


def run_extra(run_id: str | None) -> dict[str, Any]:
    """The ``extra=`` of a record logged in the course of run ``run_id``."""
    return {"run_id": run_id}


def tool_raised(name: str, exc: BaseException, run_id: str | None) -> None:
    """Log that tool ``name`` raised ``exc`` (with its traceback) and record it on the
    call's span when the call is traced. Called where the exception is turned into the
    error result the model sees."""
    log.warning(
        "tool %r raised %s; the model is told",
        name,
        type(exc).__name__,
        exc_info=exc,
        extra=run_extra(run_id),
    )
    record = TOOL_FAILURE.get()
    if record is not None:
        record(exc)
