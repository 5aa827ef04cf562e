"""The steps of a run's tool call besides its execution: a suspended call's request put to
a resolver that does not park (or whose wait is paused or watched), a refusal told to the
tool, and the final result's ``after_tool`` hook, journal entry and stream event.

Rules of this module:

- A wait with a budget to pause (``count_wait_in_timeout=False``) pauses the run's deadline
  for exactly as long as the resolver is asked; an :class:`Ask` with a timeout is a cancel
  scope around that ask, and its passing is the rule's ``timed_out``.
- A resolver's :class:`HaltRun` halts the call; its :class:`UsageError` (it is
  misconfigured) is raised; any other exception is logged with the run's id and fed back
  as the rule's ``failed``, so the sibling calls keep running.
- A traced run's wait is watched (:class:`Watch`: one span per wait).
- A final result is kept in the journal (a durable run) before the model sees it, and
  shown to a stream after that; ``after_tool`` never sees a suspension.
- A mixin of :class:`~toolnexus_async._engine.executor.Executor`, which owns the state it
  reads (the parking resolver's fast path stays in ``Executor.run_one``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, Protocol

import anyio

from .._core.errors import UsageError
from .._core.loop import CallOutcome
from .._core.messages import ToolCall
from .._core.suspension import Ask, CallRule, Execute, Halt, Settle
from .._core.types import Answer, HaltRun, Request, Tool, ToolContext, ToolResult, request_in
from .hooks import Hooks, call_hook
from .journal import Journal
from .resolver import Resolver
from .streaming import Sink, StreamToolResult
from .tracing import run_extra

__all__ = ("CallSteps", "Executes", "Pausable", "Watch")

log = logging.getLogger("toolnexus_async")


class Executes(Protocol):
    async def execute(
        self, name: str, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> ToolResult: ...

    def get(self, name: str) -> Tool | None: ...

    def check_arguments(self, name: str, args: dict[str, Any]) -> str | None: ...

    async def refused(self, name: str, args: dict[str, Any], ctx: ToolContext) -> None: ...


class Watch(Protocol):
    """Who sees each wait for a person (a traced run's tracer: one span per wait)."""

    def wait(self, call: ToolCall, request: Request, asked: Awaitable[Answer]) -> Awaitable[Answer]:
        """``asked``, awaited on the watcher's behalf."""
        ...


class Pausable(Protocol):
    """A run deadline that human waits may be kept out of (``count_wait_in_timeout=False``)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class CallSteps:
    """Asking a resolver for a call's answer, telling a tool it was refused, and a final
    result's hook, journal entry and stream event."""

    __slots__ = ()

    _budget: Pausable | None
    _resolver: Resolver | None
    _run_id: str
    _toolkit: Executes
    _turn: int | None
    _watch: Watch | None
    _hooks: Hooks | None
    _journal: Journal | None
    _on_event: Sink | None

    async def _ask(self, rule: CallRule, ask: Ask, call: ToolCall) -> Settle | Halt | Execute | Ask:
        """Ask a resolver that is not a parking one (or with a wait budget to pause, or a
        watched wait)."""
        budget = self._budget
        if budget is not None:
            budget.pause()
        try:
            if ask.timeout is not None:
                with anyio.move_on_after(ask.timeout) as scope:
                    answer = await self._asking(call, ask.request)
                if scope.cancelled_caught:
                    return rule.timed_out()
            else:
                answer = await self._asking(call, ask.request)
        except HaltRun:
            return rule.halted()
        except UsageError:
            raise  # a misconfigured resolver (it returned no Answer): loud, not fed to the model
        except Exception as exc:
            # The host's resolver failed: tell the model, keep the sibling calls running.
            log.exception(
                "wait_for raised while resolving request %s",
                ask.request.id,
                extra=run_extra(self._run_id),
            )
            return rule.failed(exc)
        finally:
            if budget is not None:
                budget.resume()
        return rule.answered(answer)

    def _asking(self, call: ToolCall, request: Request) -> Awaitable[Answer]:
        """The resolver's answer to ``request``, awaited inside its wait span if watched."""
        resolver = self._resolver
        assert resolver is not None
        asked = resolver.ask(request, self._run_id)
        watch = self._watch
        return asked if watch is None else watch.wait(call, request, asked)

    async def _tell_refused(self, call: ToolCall, request: Request | None, refusal: Answer) -> None:
        """Tell the tool its request was refused; ctx is the one its executions had."""
        ctx = ToolContext(
            answer=refusal,
            call_id=call.id,
            run_id=self._run_id,
            tool_name=call.name,
            request=request,
            turn=self._turn,
        )
        await self._toolkit.refused(call.name, call.arguments, ctx)

    def _context(self, call: ToolCall, action: Execute) -> ToolContext:
        """What the hooks and the tool are told of the call ``action`` executes."""
        return ToolContext(
            answer=action.answer,
            call_id=call.id,
            run_id=self._run_id,
            tool_name=call.name,
            request=action.request,
            turn=self._turn,
        )

    async def _final(self, call: ToolCall, last: Execute, outcome: CallOutcome) -> CallOutcome:
        """Apply ``after_tool`` to a result the model will see (never to a suspension)."""
        hooks = self._hooks
        if hooks is not None and hooks.after_tool is not None:
            ctx = self._context(call, last)
            try:
                changed = await call_hook(
                    hooks.after_tool, call.name, call.arguments, outcome.result, ctx
                )
            except Exception as exc:
                changed = ToolResult.error(
                    f"after_tool hook raised {type(exc).__name__} for {call.name!r}: {exc}"
                )
            if isinstance(changed, ToolResult) and request_in(changed) is None:
                outcome = CallOutcome(changed, outcome.request, outcome.answered_ok)
        if self._journal is not None:
            # Kept before the model sees it: after a crash this call never runs again.
            await self._journal.settled(call, outcome)
        if self._on_event is not None:
            result = outcome.result
            declined = outcome.answered_ok is False
            self._on_event(
                StreamToolResult(call.id, call.name, result.output, result.is_error, declined)
            )
        return outcome
