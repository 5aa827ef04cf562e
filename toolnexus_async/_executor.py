"""Runs the tool calls of one turn, and applies the suspension rule to each call.

Rules of this module (DESIGN §3):

- The calls of a turn run concurrently in one task group that owns their tasks (the first
  call runs in the calling task); the outcomes come back in call order. A failing tool is
  an error result (the toolkit sees to that) and never cancels its siblings; only
  cancellation propagates. The group is ``asyncio.TaskGroup``, not anyio's: on this hot
  path anyio's group cost 52 us of CPU per run against 31 us and doubled GC collections
  (500 concurrent runs, no HTTP). Both are structured; an anyio cancel scope around a run
  still reaches the children, through the calling task that the group belongs to.
- A call whose result is a suspension, when ``wait_for`` is set, awaits ``wait_for`` in that
  call's own task, so two approvals asked in one turn are outstanding at the same time.
  - ``answer.ok``: the same tool runs once more with the same arguments and
    ``ctx.answer``; if it suspends again the model gets ``"unresolved: <prompt>"``.
  - not ``answer.ok``: the model gets ``"declined/expired: <prompt>"``.
  - an answer whose id does not echo the request's is refused: the model gets an error
    naming both ids, and the tool does not run again.
  - a request whose ``expires_at`` has passed is answered as expired without asking, and
    one that expires while ``wait_for`` is pending is answered as expired at that moment.
- ``wait_for`` may raise :class:`HaltRun` instead of answering: the call then stays
  suspended, as if there were no ``wait_for``, and the run halts on it.
- Without ``wait_for`` the suspension is returned as is and the loop halts the run on it,
  unless its ``expires_at`` has already passed: then it is answered as expired, as above.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio

from ._loop import CallOutcome, HaltedTurn
from ._messages import ToolCall
from ._types import Answer, HaltRun, Request, ToolContext, ToolResult, request_in

__all__ = ("Executor", "WaitFor")

log = logging.getLogger("toolnexus_async")

WaitFor = Callable[[Request], Awaitable[Answer] | Answer]


class _Executes(Protocol):
    async def execute(
        self, name: str, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> ToolResult: ...


class Executor:
    """Executes tool calls through a toolkit on behalf of one run."""

    __slots__ = ("_run_id", "_toolkit", "_wait_for")

    def __init__(self, toolkit: _Executes, wait_for: WaitFor | None, run_id: str) -> None:
        self._toolkit = toolkit
        self._wait_for = wait_for
        self._run_id = run_id

    async def run(self, calls: Sequence[ToolCall]) -> list[CallOutcome]:
        """One outcome per call, in call order."""
        return await _concurrently([functools.partial(self.run_one, call) for call in calls])

    async def resume(
        self,
        halted: HaltedTurn,
        answers: Mapping[str, tuple[Request, Answer]],
        kept: Mapping[str, ToolResult] | None = None,
    ) -> list[CallOutcome]:
        """Outcomes for every call of a halted turn, in call order.

        A call that completed keeps its result and is never executed again (``kept`` may
        supply the full results, metadata included); a call answered in ``answers`` (keyed
        by call id) runs again with ``ctx.answer``; any other open call runs again and may
        suspend again.
        """
        jobs: list[Callable[[], Awaitable[CallOutcome]]] = []
        for call in halted.assistant.tool_calls:
            done = halted.completed.get(call.id)
            if done is not None:
                result = (kept or {}).get(call.id) or ToolResult(done.output, done.is_error)
                jobs.append(functools.partial(_ready, CallOutcome(result)))
            elif call.id in answers:
                request, answer = answers[call.id]
                ctx = ToolContext(call_id=call.id, run_id=self._run_id, tool_name=call.name)
                jobs.append(functools.partial(self._answered, call, ctx, request, answer))
            else:
                jobs.append(functools.partial(self.run_one, call))
        return await _concurrently(jobs)

    async def run_one(self, call: ToolCall) -> CallOutcome:
        """Execute one call and, when it suspends and ``wait_for`` is set, resolve it."""
        if call.invalid_arguments is not None:
            return CallOutcome(
                ToolResult.error(
                    f"invalid arguments for tool {call.name!r}: expected a JSON object, got "
                    f"{_excerpt(call.invalid_arguments)}; call it again with valid JSON"
                )
            )
        ctx = ToolContext(call_id=call.id, run_id=self._run_id, tool_name=call.name)
        result = await self._toolkit.execute(call.name, call.arguments, ctx)
        request = request_in(result)
        if request is None:
            return CallOutcome(result)
        if self._wait_for is None:
            if request.expired():
                # Nobody can answer it any more: halting on it would park a dead request.
                return CallOutcome(_declined(request), request, False)
            return CallOutcome(result, request)
        return await self._resolve(call, ctx, request)

    async def _resolve(self, call: ToolCall, ctx: ToolContext, request: Request) -> CallOutcome:
        try:
            answer = await self._ask(request)
        except HaltRun:
            # The resolver gave up waiting: the call stays suspended and the run halts on it.
            return CallOutcome(ToolResult.pending(request), request)
        if isinstance(answer, ToolResult):
            return CallOutcome(answer, request, None)
        return await self._answered(call, ctx, request, answer)

    async def _answered(
        self, call: ToolCall, ctx: ToolContext, request: Request, answer: Answer
    ) -> CallOutcome:
        """Apply the host's answer to a suspended call: retry it once, or report the refusal."""
        if not answer.ok:
            return CallOutcome(_declined(request), request, False)
        retry_ctx = ToolContext(
            answer=answer, call_id=ctx.call_id, run_id=ctx.run_id, tool_name=ctx.tool_name
        )
        retried = await self._toolkit.execute(call.name, call.arguments, retry_ctx)
        again = request_in(retried)
        if again is not None:
            # Asking again could loop forever; the model decides what to do instead.
            return CallOutcome(ToolResult.error(f"unresolved: {again.prompt}"), request, True)
        return CallOutcome(retried, request, True)

    async def _ask(self, request: Request) -> Answer | ToolResult:
        """The host's answer, or an error result explaining why there is none."""
        wait_for = self._wait_for
        assert wait_for is not None
        left = request.seconds_left()
        if left is not None and left <= 0:
            return Answer(request.id, False, reason="expired")
        # A resolver that enforces expires_at itself (an Inbox) needs no cancel scope here;
        # neither does a request without one. A scope per parked run costs memory.
        timed = left is not None and not getattr(wait_for, "handles_expiry", False)
        try:
            if timed:
                with anyio.move_on_after(left) as scope:
                    answer = wait_for(request)
                    if inspect.isawaitable(answer):
                        answer = await answer
                if scope.cancelled_caught:
                    return Answer(request.id, False, reason="expired")
            else:
                answer = wait_for(request)
                if inspect.isawaitable(answer):
                    answer = await answer
        except HaltRun:
            raise
        except Exception as exc:
            # The host's resolver failed: tell the model, keep the sibling calls running.
            log.exception("wait_for raised while resolving request %s", request.id)
            return ToolResult.error(
                f"could not resolve {request.prompt!r}: wait_for raised {type(exc).__name__}: {exc}"
            )
        if not isinstance(answer, Answer):
            return ToolResult.error(
                f"could not resolve {request.prompt!r}: wait_for returned "
                f"{type(answer).__name__}, not an Answer"
            )
        if answer.id != request.id:
            return ToolResult.error(
                f"refused an answer with id {answer.id!r}: it does not match request id "
                f"{request.id!r} ({request.prompt})"
            )
        return answer


async def _ready(outcome: CallOutcome) -> CallOutcome:
    return outcome


async def _concurrently(
    jobs: Sequence[Callable[[], Awaitable[CallOutcome]]],
) -> list[CallOutcome]:
    """Run ``jobs`` concurrently in one task group; their outcomes in the order given."""
    if len(jobs) == 1:
        return [await jobs[0]()]
    outcomes: list[CallOutcome | None] = [None] * len(jobs)

    async def slot(index: int) -> None:
        outcomes[index] = await jobs[index]()

    async with asyncio.TaskGroup() as tg:
        for index in range(1, len(jobs)):
            tg.create_task(slot(index))
        # The first job runs in this task: one task fewer per turn, the same concurrency
        # (the others start as soon as it awaits anything).
        await slot(0)
    return [o for o in outcomes if o is not None]


def _declined(request: Request) -> ToolResult:
    return ToolResult.error(f"declined/expired: {request.prompt}")


def _excerpt(text: str, limit: int = 200) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."
