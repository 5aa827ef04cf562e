"""The steps of a run's tool call besides the suspension rule's loop: an execution through
its ``before_tool`` hook and its metric (:meth:`CallSteps._invoke`), a suspended call's
request put to a resolver that does not park (or whose wait is paused or watched), a
refusal told to the tool, and the final result's ``after_tool`` hook, journal entry and
stream event.

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

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio

from .._core.errors import UsageError
from .._core.loop import CallOutcome
from .._core.messages import ToolCall
from .._core.suspension import Ask, CallRule, Execute, Halt, Settle, hooks_own
from .._core.types import Answer, HaltRun, Request, Tool, ToolContext, ToolResult, request_in
from .hooks import Hooks, PlainBeforeTool, call_hook
from .journal import Journal
from .resolver import Resolver
from .streaming import Sink, StreamToolResult
from .toolkit import ToolRegistry
from .tracing import run_extra

__all__ = (
    "CallSteps",
    "Executes",
    "Pausable",
    "Plan",
    "ToolOutcome",
    "Watch",
    "hook_raised",
)

log = logging.getLogger("toolnexus_async")

ToolOutcome = Literal["ok", "error", "pending"]
# (tool name, tool source, outcome, seconds) for metrics; a suspension is "pending".
OnTool = Callable[[str, str, ToolOutcome, float], None]


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


class Plan:
    """What every executor of one engine shares, decided once when the engine is built:
    its resolver, tool hooks, metric and watcher, and what they let ``run_one`` skip.
    A turn's executor then makes only what is the run's (engine ``_plan``)."""

    __slots__ = (
        "gate",
        "gated",
        "hand_out",
        "hooks",
        "on_tool",
        "park",
        "plain",
        "resolver",
        "watch",
    )

    def __init__(
        self,
        resolver: Resolver | None,
        hooks: Hooks | None = None,
        on_tool: OnTool | None = None,
        watch: Watch | None = None,
        gate: PlainBeforeTool | None = None,
    ) -> None:
        self.resolver = resolver
        self.on_tool = on_tool
        self.watch = watch
        # Hooks without tool seams cost nothing per call.
        has_tool_hooks = hooks is not None and (hooks.before_tool or hooks.after_tool)
        self.hooks = hooks if has_tool_hooks else None
        # hooks.before_tool as the plain function it is underneath, if it is a
        # require_approval gate (plain_before_tool: the engine asks once, not every turn).
        self.gate = gate if has_tool_hooks else None
        no_after_tool = hooks is None or hooks.after_tool is None
        # The gate when it is the only tool hook (and, per run, nothing is kept of a
        # call): run_one asks it itself, without _invoke (a coroutine and a tuple per call).
        self.gated = gate if gate is not None and has_tool_hooks and no_after_tool else None
        # A result goes back as it is (no _final) when, per run, nothing keeps or shows it.
        self.plain = no_after_tool
        # Awaited in run_one itself unless the wait is watched (a traced run's wait span)
        # or, per run, a wait budget must be paused around it.
        self.park = resolver.park if resolver is not None and watch is None else None
        # Whether a call's rule, asking after the call's first execution, can be rebuilt
        # from its request alone (CallRule.asked reads whose request it is from its mark),
        # so that the engine may wait for a turn's last call itself (Executor.run_one's
        # hand_out): so with no before_tool hook, or a require_approval gate, whose
        # requests all carry the mark; another hook's request may not.
        before_tool = None if hooks is None else hooks.before_tool
        self.hand_out = self.park is not None and (before_tool is None or gate is not None)


class CallSteps:
    """Asking a resolver for a call's answer, telling a tool it was refused, and a final
    result's hook, journal entry and stream event."""

    __slots__ = ()

    _plan: Plan
    _budget: Pausable | None
    _run_id: str
    _toolkit: Executes
    _turn: int | None
    _hooks: Hooks | None
    _journal: Journal | None
    _on_event: Sink | None
    _registry: ToolRegistry | None
    _on_tool: OnTool | None

    async def _ask(self, rule: CallRule, ask: Ask, call: ToolCall) -> Settle | Halt | Execute | Ask:
        """Ask a resolver that is not a parking one (or with a wait budget to pause, or a
        watched wait)."""
        budget = self._budget
        if budget is not None:
            budget.pause()
        try:
            if ask.timeout is not None:
                with anyio.move_on_after(ask.timeout) as scope:
                    got: Answer | Exception = await self._asking(call, ask.request)
                if scope.cancelled_caught:
                    return rule.timed_out()
            else:
                got = await self._asking(call, ask.request)
        except Exception as exc:
            got = exc
        finally:
            if budget is not None:
                budget.resume()
        return self._woken(rule, got)

    def _woken(self, rule: CallRule, got: Answer | Exception) -> Settle | Halt | Execute | Ask:
        """What ``rule`` (asking) makes of the end of its wait: the resolver's answer, or
        what the resolver raised. Its :class:`HaltRun` halts the call; its
        :class:`UsageError` (it is misconfigured: it returned no Answer) is raised, loud and
        not fed to the model; anything else is logged with the run's id and fed back as the
        rule's ``failed``, so the sibling calls keep running."""
        if not isinstance(got, Exception):
            return rule.answered(got)
        if isinstance(got, HaltRun):
            return rule.halted()
        if isinstance(got, UsageError):
            raise got
        request = rule.request
        assert request is not None  # asking: it holds the request it asked
        log.error(
            "wait_for raised while resolving request %s",
            request.id,
            exc_info=got,
            extra=run_extra(self._run_id),
        )
        return rule.failed(got)

    def _asking(self, call: ToolCall, request: Request) -> Awaitable[Answer]:
        """The resolver's answer to ``request``, awaited inside its wait span if watched."""
        resolver = self._plan.resolver
        assert resolver is not None
        asked = resolver.ask(request, self._run_id)
        watch = self._plan.watch
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

    async def _invoke(
        self, call: ToolCall, action: Execute
    ) -> tuple[ToolResult, bool, dict[str, Any] | None]:
        """``before_tool`` (if any), then the tool; reports the execution to metrics.

        Returns the result, whether the hook (not the tool) gave it, and the arguments the
        hook gave instead of the model's (``None``: it changed nothing).
        """
        journal, gate = self._journal, self._plan.gate
        if journal is not None and gate is None:
            await journal.fence()
        started = time.perf_counter()
        # A gate reads only the answer: its calls' context is made for the tool, if at all.
        ctx = self._context(call, action) if gate is None else None
        result: ToolResult | None = None
        by_gate = False
        changed: dict[str, Any] | None = None
        args = call.arguments
        hooks = self._hooks
        if hooks is not None and hooks.before_tool is not None:
            try:
                verdict: Any
                if gate is not None:
                    # An approved gate sees its answer; the tool, which never asked, does not.
                    answer = action.hook_answer
                    verdict = gate(call.name, args, action.answer if answer is None else answer)
                else:
                    assert ctx is not None  # made above for any hook but a gate
                    hook_ctx = ctx
                    if action.hook_answer is not None:
                        hook_ctx = ToolContext(
                            answer=action.hook_answer,
                            call_id=call.id,
                            run_id=self._run_id,
                            tool_name=call.name,
                            turn=self._turn,
                        )
                    # call_hook's work, without its coroutine: this runs for every call.
                    verdict = hooks.before_tool(call.name, args, hook_ctx)
                    if inspect.isawaitable(verdict):
                        verdict = await verdict
            except Exception as exc:
                result = hook_raised(call, exc)
            else:
                if isinstance(verdict, ToolResult):
                    # A host's own hook's request is marked as a gate's here; a gate's is
                    # marked by require_approval itself.
                    result = verdict if gate is not None else hooks_own(call, verdict)
                    by_gate = request_in(result) is not None
                elif isinstance(verdict, dict) and verdict != args:
                    # Checked even when the toolkit does not validate the model's calls: these
                    # arguments come from a hook or an approver, after the model's were shown.
                    args = changed = verdict
                    problem = self._toolkit.check_arguments(call.name, args)
                    if problem is not None:
                        result = ToolResult.error(
                            f"{problem} (they were changed by a before_tool hook or on approval)"
                        )
        if result is None:
            if journal is not None and gate is not None:
                # After the gate's verdict (no hook of the host's ran): a gate that asks
                # has its turn written with its request (``Journal.suspended``).
                await journal.fence()
            if ctx is not None:
                result = await self._toolkit.execute(call.name, args, ctx)
            elif self._registry is not None and action.answer is None and action.request is None:
                # The context made only if the tool needs it (execute_call).
                result = await self._registry.execute_call(
                    call.name, args, call.id, self._run_id, self._turn
                )
            else:
                result = await self._toolkit.execute(call.name, args, self._context(call, action))
        self._report(call.name, result, started)
        return result, by_gate, changed

    def _report(self, name: str, result: ToolResult, started: float) -> None:
        """One tool execution to metrics: a suspension is "pending", never "error"."""
        if self._on_tool is None:
            return
        outcome: ToolOutcome = (
            "pending"
            if result.metadata is not None and request_in(result) is not None
            else ("error" if result.is_error else "ok")
        )
        self._count(name, outcome, started)

    def _count(self, name: str, outcome: ToolOutcome, started: float) -> None:
        """:meth:`_report` with the outcome known (there is an ``on_tool``)."""
        on_tool = self._on_tool
        assert on_tool is not None
        registry = self._registry
        # A registry's own tools read as its execute reads them: no get() call per call.
        tool = self._toolkit.get(name) if registry is None else registry._tools.get(name)
        source = "unknown" if tool is None else tool.source
        on_tool(name, source, outcome, time.perf_counter() - started)


def hook_raised(call: ToolCall, exc: Exception) -> ToolResult:
    """The result the model is given when ``before_tool`` raised ``exc``."""
    kind = type(exc).__name__
    return ToolResult.error(f"before_tool hook raised {kind} for {call.name!r}: {exc}")
