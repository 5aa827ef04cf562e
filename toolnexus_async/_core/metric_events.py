"""Metric events: what the client reports per model request, per tool call and per run.

Rule of this module: an event is a frozen value the client builds only when someone
listens (``on_metric``); the client's own registry is fed the same values without one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import attrs

if TYPE_CHECKING:
    from .._engine.metrics import MetricsRegistry

__all__ = ("LlmCallEvent", "MetricEvent", "Reporter", "RunEvent", "ToolCallEvent")

log = logging.getLogger("toolnexus_async")

# Plain ``str`` fields, so callers need not narrow; the validators keep the sets closed.
_LLM_STATUSES = ("ok", "error")
_TOOL_OUTCOMES = ("ok", "error", "pending")
_RUN_STATUSES = ("done", "pending", "incomplete", "error")

_non_negative = attrs.validators.ge(0)  # also refuses NaN: ``nan >= 0`` is false


@attrs.frozen
class LlmCallEvent:
    """One request to the model, successful or not.

    Attributes:
        model: the model asked for (or the one that answered).
        style: the wire style, ``"openai"``, ``"anthropic"`` or ``"gemini"``.
        status: ``"ok"``, or ``"error"`` when the request raised.
        seconds: how long the request took, measured by the caller.
        prompt_tokens: prompt tokens the provider reported (0 when none).
        completion_tokens: completion tokens the provider reported (0 when none).
        error: the exception's class name on ``"error"``; never its message, which may
            quote a provider body.
        cache_read_tokens: of the prompt tokens, those read from the prompt cache.
        cache_write_tokens: of the prompt tokens, those written to the prompt cache.
        reasoning_tokens: of the completion tokens, those spent reasoning.
    """

    model: str
    style: str
    status: str = attrs.field(validator=attrs.validators.in_(_LLM_STATUSES))
    seconds: float = attrs.field(validator=_non_negative)
    prompt_tokens: int = attrs.field(default=0, validator=_non_negative)
    completion_tokens: int = attrs.field(default=0, validator=_non_negative)
    error: str | None = None
    cache_read_tokens: int = attrs.field(default=0, validator=_non_negative)
    cache_write_tokens: int = attrs.field(default=0, validator=_non_negative)
    reasoning_tokens: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class ToolCallEvent:
    """One tool call.

    Attributes:
        tool: the tool's name.
        source: where the tool came from (its ``source``, e.g. ``"builtin"``).
        outcome: ``"ok"``, ``"error"`` (an error result), or ``"pending"`` when the call
            suspended; a suspension is never an error.
        seconds: how long the call took, measured by the caller.
    """

    tool: str
    source: str
    outcome: str = attrs.field(validator=attrs.validators.in_(_TOOL_OUTCOMES))
    seconds: float = attrs.field(validator=_non_negative)


@attrs.frozen
class RunEvent:
    """One run, at its end.

    Attributes:
        status: the run's status (``"done"``, ``"pending"``, ``"incomplete"``), or
            ``"error"`` when the run raised.
        turns: model requests the run made.
        seconds: the run's wall time, human waits included, measured by the caller.
        model: the model that answered last, if any.
    """

    status: str = attrs.field(validator=attrs.validators.in_(_RUN_STATUSES))
    turns: int = attrs.field(validator=_non_negative)
    seconds: float = attrs.field(validator=_non_negative)
    model: str | None = None


MetricEvent: TypeAlias = LlmCallEvent | ToolCallEvent | RunEvent


class Reporter:
    """How the client reports: its own registry always, the host's ``on_metric`` if set.

    The registry is fed plain values; event objects are built only for a listener.
    """

    __slots__ = ("listener", "registry", "tool")

    def __init__(
        self, registry: MetricsRegistry, listener: Callable[[MetricEvent], object] | None
    ) -> None:
        self.registry = registry
        self.listener = listener
        # tool(tool, source, outcome, seconds): without a listener, the registry's own
        # method, which takes the same arguments: no call of ours between the executor
        # and the count, for every tool call.
        self.tool: Callable[[str, str, str, float], None] = (
            registry.record_tool if listener is None else self._tool
        )

    def llm(
        self,
        model: str,
        style: str,
        status: str,
        seconds: float,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        error: str | None = None,
        parts: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """``parts``: the cache read, cache write and reasoning tokens, as in Usage."""
        self.registry.record_llm(model, status, seconds, prompt_tokens, completion_tokens, parts)
        if self.listener is not None:
            read, written, reasoning = parts
            self._tell(
                LlmCallEvent(
                    model,
                    style,
                    status,
                    seconds,
                    prompt_tokens,
                    completion_tokens,
                    error,
                    read,
                    written,
                    reasoning,
                )
            )

    def _tool(self, tool: str, source: str, outcome: str, seconds: float) -> None:
        self.registry.record_tool(tool, source, outcome, seconds)
        if self.listener is not None:
            self._tell(ToolCallEvent(tool, source, outcome, seconds))

    def run(self, status: str, turns: int, seconds: float, model: str | None) -> None:
        self.registry.record_run(status, seconds)
        if self.listener is not None:
            self._tell(RunEvent(status, turns, seconds, model))

    def _tell(self, event: MetricEvent) -> None:
        assert self.listener is not None
        try:
            self.listener(event)
        except Exception:
            # Observability must not break a run.
            log.exception("on_metric raised for %r", event)
