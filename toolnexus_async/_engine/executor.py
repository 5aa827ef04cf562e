"""Runs the tool calls of one turn, performing what the suspension rule asks for each.

Rules of this module:

- It decides nothing about suspensions: :class:`~toolnexus_async._core.suspension.CallRule`
  does, and this module performs its actions (execute the call, ask the resolver) and feeds
  back what happened. What it owns is the I/O around them: hooks, metrics, stream events,
  the waits (``callsteps``: an :class:`Ask`'s time limit, the run's deadline paused).
- The calls of a turn run concurrently (``_concurrency.run_concurrently``): a call that
  finishes without awaiting needs no task, the first call that waits goes on in the
  calling task and the calls after it start in tasks of one ``asyncio.TaskGroup``; the
  outcomes come back in call order. A failing tool is an error result (the toolkit sees
  to that) and never cancels its siblings; only cancellation propagates. The group is
  ``asyncio.TaskGroup``, not anyio's: on this hot path anyio's group cost 52 us of CPU per
  run against 31 us and doubled GC collections (500 concurrent runs, no HTTP). Both are
  structured; an anyio cancel scope around a run still reaches the children, through the
  calling task that the group belongs to.
- A suspended call waits for its answer in the course of that call, concurrently with the
  other calls of the turn, so two approvals asked in one turn are outstanding at once.
- A parking resolver (the Inbox) is awaited right in :meth:`Executor.run_one`, and a parked
  call holds only what it needs to wake: what 100,000 parked runs hold adds up.
- A request becomes visible to a stream (``StreamPending``) when it is outstanding: before
  the resolver is asked, or when the run halts on it. With a journal (a durable run) it is
  kept there first, and every result the model will see is kept before it is fed back.
- A call settled as declined/expired on its own request tells its tool first
  (``Toolkit.refused``, rule 8 of ``_suspension``), before the result is kept or fed back:
  a crash in between tells it again on recovery (at least once, like an execution).
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Literal, overload

from .._core.errors import StoreError, UsageError
from .._core.loop import CallOutcome, HaltedTurn
from .._core.messages import ToolCall
from .._core.suspension import FIRST, Ask, CallRule, Execute, Halt, Settle
from .._core.types import Answer, Request, ToolContext, ToolResult, request_in
from .callsteps import CallSteps, Executes, Pausable, Plan, ToolOutcome, hook_raised
from .concurrency import run_all, run_concurrently
from .journal import Journal
from .streaming import Sink, StreamPending
from .toolkit import ToolRegistry

__all__ = ("Executor", "Plan")


# What a call comes to: a bare result when there is nothing else to say (RunLoop takes both).
Outcome = CallOutcome | ToolResult


class Executor(CallSteps):
    """Executes tool calls through a toolkit on behalf of one run."""

    __slots__ = (
        "_budget",
        "_gated",
        "_hooks",
        "_journal",
        "_on_event",
        "_on_tool",
        "_park",
        "_plain",
        "_plan",
        "_registry",
        "_run_id",
        "_toolkit",
        "_turn",
    )

    def __init__(
        self,
        plan: Plan,
        toolkit: Executes,
        run_id: str,
        budget: Pausable | None = None,
        on_event: Sink | None = None,
        journal: Journal | None = None,
        turn: int | None = None,
    ) -> None:
        self._plan = plan
        self._toolkit = toolkit
        # A registry whose execute is ToolRegistry's own (not a tracer's wrapper, nor a
        # subclass's override) with a turn number: its execute_call does that execute.
        self._registry = (
            toolkit
            if type(toolkit).execute is _EXECUTE and isinstance(toolkit, ToolRegistry)
            else None
        )
        self._run_id = run_id
        self._turn = turn
        self._budget = budget
        self._on_event = on_event
        self._journal = journal
        self._hooks = plan.hooks
        self._on_tool = plan.on_tool
        self._gated = plan.gated if journal is None else None
        self._plain = plan.plain and journal is None and on_event is None
        self._park = plan.park if budget is None else None

    def run(self, calls: Sequence[ToolCall]) -> tuple[Outcome, ...] | Awaitable[list[Outcome]]:
        """One outcome per call, in call order, as ``run_concurrently`` hands them back:
        a tuple of every call's but the last when none of those waited (the engine then
        awaits the last call's :meth:`run_one` itself), else an awaitable of them all. Not
        a coroutine: what it hands back is what a parked run holds."""
        return run_concurrently(self.run_one, calls, _LOUD)

    def resume(
        self,
        halted: HaltedTurn,
        answers: Mapping[str, tuple[Request, Answer]],
        kept: Mapping[str, ToolResult] | None = None,
        waiting: Mapping[str, Request] | None = None,
    ) -> Awaitable[list[Outcome]]:
        """Outcomes for every call of a halted turn, in call order.

        A call that completed keeps its result and is never executed again (``kept`` may
        supply the full results, metadata included); a call answered in ``answers`` (keyed
        by call id) goes on from that answer; a call in ``waiting`` waits for its request
        again without running again; any other open call runs again and may suspend again.
        """
        jobs: list[Callable[[], Coroutine[Any, Any, Outcome]]] = []
        for call in halted.assistant.tool_calls:
            done = halted.completed.get(call.id)
            if done is not None:
                result = (kept or {}).get(call.id) or ToolResult(done.output, done.is_error)
                jobs.append(functools.partial(_ready, CallOutcome(result)))
            elif call.id in answers:
                jobs.append(functools.partial(self.run_one, call, answers[call.id]))
            elif waiting is not None and call.id in waiting:
                jobs.append(functools.partial(self.run_one, call, (waiting[call.id], None)))
            else:
                jobs.append(functools.partial(self.run_one, call))
        return run_all(operator.call, jobs, _LOUD)

    def _rule(self, call: ToolCall) -> CallRule:
        resolver = self._plan.resolver
        if resolver is None:
            return CallRule(call, False)
        # By position: a class called with keywords makes a dict of them, per held call.
        return CallRule(call, True, resolver.enforces_expiry)

    @overload
    async def run_one(
        self,
        call: ToolCall,
        resumed: tuple[Request, Answer | Exception | None] | None = None,
        hand_out: Literal[False] = False,
    ) -> Outcome: ...

    @overload
    async def run_one(self, call: ToolCall, resumed: None, hand_out: bool) -> Outcome | Request: ...

    async def run_one(
        self,
        call: ToolCall,
        resumed: tuple[Request, Answer | Exception | None] | None = None,
        hand_out: bool = False,
    ) -> Outcome | Request:
        """One call under the suspension rule, to the outcome the model sees.

        ``resumed``: the call raised this request (before a halt, or just now in the
        engine's hand-out) and here is what its wait came to: the answer, what the resolver
        raised, or ``None`` (not answered yet: the call waits for it again). The call's
        rule is rebuilt from the request alone.

        ``hand_out`` (the engine, for a turn's last call, which it awaits in the run's own
        frame, when ``Plan.hand_out`` allows it): a call that must wait for a parking
        resolver after its first execution hands back the request instead of waiting
        here; the engine awaits the park itself and goes on with ``resumed``, exactly as
        the wait here would have. A run parked so holds neither this coroutine's frame,
        nor the call's rule, nor the turn's executor (``benchmarks/peers`` parking over
        HTTP: fewer objects for the collector to walk in every parked run). The wait of a
        retry (after an approval) stays here, as every wait of a call in a task does.
        """
        last = FIRST  # the latest execution: whose ctx after_tool sees
        changed: dict[str, Any] | None = None  # what the latest execution ran with instead
        if resumed is not None:
            rule = self._rule(call)
            request, got = resumed
            if got is None:
                action = rule.waiting(request)
            else:
                rule.asked(request)
                action = self._woken(rule, got)
            del got  # an exception's traceback refers to this frame
        elif call.invalid_arguments is None:
            # The common call: the tool (and its before_tool hook, if any) is awaited right
            # here, and the rule is consulted only if it suspends (instructions.py: 3.1 %
            # more instructions per run without this path, 1,568,493 against 1,520,700).
            gate = self._gated
            if self._hooks is None or gate is not None:
                if self._journal is not None:
                    await self._journal.fence()
                started = time.perf_counter()
                verdict: dict[str, Any] | ToolResult | None = None
                if gate is not None:
                    # The only tool hook is a require_approval gate: its verdict, without
                    # _invoke's coroutine (what _invoke does with FIRST; a gate asked
                    # without an answer gives None or a ToolResult, never arguments).
                    try:
                        verdict = gate(call.name, call.arguments, None)
                    except Exception as exc:
                        verdict = hook_raised(call, exc)
                if isinstance(verdict, ToolResult):
                    result = verdict
                else:
                    registry = self._registry
                    if registry is not None:
                        # The context made only if the tool needs it (execute_call).
                        result = await registry.execute_call(
                            call.name, call.arguments, call.id, self._run_id, self._turn
                        )
                    else:
                        # By position (answer, call_id, run_id, tool_name, request, turn):
                        # keywords would make a dict per call.
                        ctx = ToolContext(None, call.id, self._run_id, call.name, None, self._turn)
                        result = await self._toolkit.execute(call.name, call.arguments, ctx)
                        del ctx
                # No metadata, no suspension: the usual result needs no call to tell.
                pending = None if result.metadata is None else request_in(result)
                by_gate = pending is not None and result is verdict
                del verdict
                if self._on_tool is not None:  # _report's work, the suspension known
                    told: ToolOutcome = (
                        "pending" if pending is not None else "error" if result.is_error else "ok"
                    )
                    self._count(call.name, told, started)
            else:
                result, by_gate, changed = await self._invoke(call, FIRST)
                pending = None if result.metadata is None else request_in(result)
            if pending is None:
                if self._plain:  # a bare result when it is all there is (the loop takes it)
                    return result if changed is None else CallOutcome(result, None, None, changed)
                return await self._final(call, last, CallOutcome(result, None, None, changed))
            rule = self._rule(call)
            rule.start()  # FIRST: what was just performed
            action = rule.executed(result, by_gate=by_gate)
            # park.py: 38 pymalloc blocks per parked run without this del, 34 with it.
            del result
        else:
            rule = self._rule(call)
            action = rule.start()
            if isinstance(action, Settle):
                # A call the model made counts in the metrics, even when the tool never ran.
                self._report(call.name, action.outcome.result, time.perf_counter())
        while True:
            if isinstance(action, Execute):
                last = action
                result, by_gate, changed = await self._invoke(call, action)
                action = rule.executed(result, by_gate=by_gate)
                del result  # as above, for calls with tool hooks (park.py has none: unmeasured)
            elif isinstance(action, Ask):
                request = action.request
                if not action.again:
                    if self._journal is not None:
                        # Kept before it is told anywhere: a restart finds what was shown.
                        await self._journal.suspended(call, request)
                    if self._on_event is not None:
                        # Before anyone is asked, so a host can push the link at once.
                        self._on_event(StreamPending(request, call.id, call.name))
                park = self._park
                if park is None:
                    action = await self._ask(rule, action, call)
                    continue
                if hand_out and last is FIRST and changed is None:
                    return request  # the engine waits (see the docstring)
                del action  # park.py: 35 blocks per parked run without this del, 34 with it
                try:
                    got = await park(request, self._run_id)
                except Exception as exc:
                    got = exc
                action = self._woken(rule, got)
                del got
            elif isinstance(action, Halt):
                if action.announce:
                    pending = action.outcome.request
                    assert pending is not None
                    if self._journal is not None:
                        await self._journal.suspended(call, pending)
                    if self._on_event is not None:
                        self._on_event(StreamPending(pending, call.id, call.name))
                return _with_changed(action.outcome, changed)
            else:
                if action.refusal is not None:
                    await self._tell_refused(call, action.outcome.request, action.refusal)
                outcome = (
                    action.outcome if changed is None else _with_changed(action.outcome, changed)
                )
                return outcome if self._plain else await self._final(call, last, outcome)


# A misconfigured resolver's UsageError, or a store's StoreError (a durable run's lease
# lost), comes out of a turn as itself, not inside a task group's ExceptionGroup, so that
# the host sees the plain error it can act on.
_LOUD = (UsageError, StoreError)
_EXECUTE: Final = ToolRegistry.execute


def _with_changed(outcome: CallOutcome, changed: dict[str, Any] | None) -> CallOutcome:
    """``outcome``, saying which arguments the tool ran with instead of the model's."""
    if changed is None:
        return outcome
    return CallOutcome(outcome.result, outcome.request, outcome.answered_ok, changed)


async def _ready(outcome: CallOutcome) -> CallOutcome:
    return outcome
