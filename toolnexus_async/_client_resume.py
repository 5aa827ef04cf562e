"""Resuming halted runs: the client's ``resume`` and ``run_with_answer``.

Rule of this module: it only turns a halted run (or a halted transcript) and its answers
into a resumed :class:`RunLoop`; the plan comes from ``_resume_plan`` (pure) and the run is
driven like any other by the client's runner. :class:`LlmClient` mixes it in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._ids import new_run_id
from ._loop import RunLoop
from ._messages import Message
from ._results import ZERO_USAGE, RunResult
from ._resume_plan import ResumePlan, plan_from_transcript, plan_resume
from ._toolkit import Toolkit
from ._types import Answer, Request

__all__ = ("Resuming",)


class Resuming:
    """``resume`` and ``run_with_answer``, for :class:`LlmClient`."""

    if TYPE_CHECKING:  # provided by LlmClient
        max_turns: int
        style: str

        def _check_open(self) -> None: ...

        def _execute(
            self,
            loop: RunLoop,
            toolkit: Toolkit,
            resume: ResumePlan | None = None,
            on_tools_done: Callable[[RunResult], Any] | None = None,
        ) -> Awaitable[RunResult]: ...

        async def _after_resume(self, halted: RunResult, result: RunResult) -> None: ...

    async def resume(
        self,
        halted: RunResult,
        answers: Answer | Iterable[Answer],
        toolkit: Toolkit,
        *,
        on_tools_done: Callable[[RunResult], Any] | None = None,
    ) -> RunResult:
        """Continue a run that halted with ``status == "pending"``, given answers to it.

        Each answer must echo the id of one of the halted turn's outstanding requests
        (``halted.suspended``). The calls of that turn that completed are never executed
        again; each answered call runs again with ``ctx.answer`` (or gets
        ``"declined/expired: <prompt>"``); the other suspended calls run again and may
        suspend again, halting the run once more on the first in call order. The model then
        sees exactly one result per call of the turn and no new user message. An answer to
        a request whose ``expires_at`` has passed counts as ``Answer(ok=False,
        reason="expired")``, whatever it says.

        ``on_tools_done`` (sync or async) is called once the halted turn's calls have run,
        before the model is asked again, with the run as it stands (``status ==
        "incomplete"``, ``limit == "resumed"``): from then on the halted state must not be
        resumed again, or the answered calls would run twice. A durable host uses it to
        know; :func:`resume_stored` does.

        Raises:
            AnswerMismatch: an answer echoes no outstanding request; nothing was executed.
            UsageError: ``halted`` is not a halted run, no answer was given, or two answers
                share an id.
        """
        self._check_open()
        plan = plan_resume(halted, answers)
        loop = RunLoop.resume(
            plan.turn,
            turns=halted.turns,
            usage=halted.usage,
            model=halted.model,
            records=halted.tool_calls,
            max_turns=self.max_turns,
            run_id=halted.run_id or new_run_id(),
            style=self.style,
        )
        result = await self._execute(loop, toolkit, plan, on_tools_done)
        await self._after_resume(halted, result)
        return result

    async def run_with_answer(
        self,
        toolkit: Toolkit,
        history: Sequence[Message],
        pending: Request,
        answer: Answer,
    ) -> RunResult:
        """Resume from a halted transcript and its pending request alone.

        ``history`` is a halted run's ``messages`` (completed results included, suspended
        calls unanswered) and ``pending`` its ``pending`` request. A transcript does not say
        which request each unanswered call raised, so the answer goes to the **first**
        unanswered call, the one ``RunResult.pending`` always belongs to; to answer another
        call of the turn, use :meth:`resume`. The rules are those of :meth:`resume`. Turn
        counts and usage start afresh (the resumed turn's records carry turn 0), since a
        transcript does not carry them.

        Raises:
            AnswerMismatch: ``answer.id`` is not ``pending.id``.
            UsageError: ``history`` is not a halted transcript.
        """
        self._check_open()
        plan = plan_from_transcript(history, pending, answer)
        loop = RunLoop.resume(
            plan.turn,
            turns=0,
            usage=ZERO_USAGE,
            model=None,
            records=(),
            max_turns=self.max_turns,
            run_id=new_run_id(),
            style=self.style,
        )
        return await self._execute(loop, toolkit, plan)
