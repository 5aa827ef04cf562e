"""``LlmClient.resume`` and ``LlmClient.run_with_answer``: plan the resume (``_resume``),
then drive it through the client's engine like any other run.

Rule of this module: nothing here decides which call gets which answer (``_resume`` does)
or what an answer does to its call (``_suspension`` does); it checks the arguments, builds
the resumed loop and its :class:`RunSpec`, and hands it to the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .._core.messages import Message
from .._core.output import stored_output
from .._core.results import RunResult
from .._core.resume import plan_from_transcript, plan_resume
from .._core.types import Answer, Request
from .engine import Engine, RunSpec
from .toolkit import ToolRegistry

__all__ = ("Resuming",)

T = TypeVar("T")


class Resuming:
    """``resume`` and ``run_with_answer``, for :class:`LlmClient`: each plans the resume
    here and drives it through the client's ``engine``."""

    if TYPE_CHECKING:  # LlmClient's public property

        @property
        def engine(self) -> Engine: ...

    async def _after_resume(self, halted: RunResult, result: RunResult) -> None:
        """Called when a :meth:`resume` ended; the client keeps its conversations here."""

    @overload
    async def resume(
        self,
        halted: RunResult,
        toolkit: ToolRegistry,
        *,
        answers: Answer | Iterable[Answer],
        on_tools_done: Callable[[RunResult], Any] | None = ...,
        output_type: type[T],
    ) -> RunResult[T]: ...

    @overload
    async def resume(
        self,
        halted: RunResult,
        toolkit: ToolRegistry,
        *,
        answers: Answer | Iterable[Answer],
        on_tools_done: Callable[[RunResult], Any] | None = ...,
        output_type: object = ...,
    ) -> RunResult[Any]: ...

    async def resume(
        self,
        halted: RunResult,
        toolkit: ToolRegistry,
        *,
        answers: Answer | Iterable[Answer],
        on_tools_done: Callable[[RunResult], Any] | None = None,
        output_type: object = None,
    ) -> RunResult[Any]:
        """Continue a run that halted with ``status == "pending"``, given answers to it.

        Each answer must echo the id of one of the halted turn's outstanding requests
        (``halted.suspended``). The calls of that turn that completed are never executed
        again; each answered call runs again with ``ctx.answer`` (or gets
        ``"declined/expired: <prompt>"``, its tool told through ``refused`` if it has
        one); the other suspended calls run again and may
        suspend again, halting the run once more on the first in call order. The model then
        sees exactly one result per call of the turn and no new user message. An answer to
        a request whose ``expires_at`` has passed counts as ``Answer(ok=False,
        reason="expired")``, whatever it says.

        ``on_tools_done`` (sync or async) is called once the halted turn's calls have run,
        before the model is asked again, with the run as it stands (``status ==
        "incomplete"``, ``limit == "resumed"``): from then on the halted state must not be
        resumed again, or the answered calls would run twice. A durable host uses it to
        know; :func:`resume_stored` does.

        A run given an ``output_type`` keeps its schema (``halted.output_spec``): the
        resumed run's output is validated against it, and built as ``output_type`` when
        that is given again (else it is the validated JSON; ``RunResult[T]`` types it
        then, ``RunResult[Any]`` else).

        Raises:
            AnswerMismatchError: an answer echoes no outstanding request; nothing was executed.
            UsageError: ``halted`` is not a halted run, no answer was given, or two answers
                share an id.
        """
        engine = self.engine
        plan = plan_resume(halted, answers)
        loop = engine.resumed_loop(
            plan.turn,
            run_id=halted.run_id,
            turns=halted.turns,
            usage=halted.usage,
            model=halted.model,
            records=halted.tool_calls,
            trace=halted.trace_context,
            output=stored_output(halted.output_spec, output_type),
            output_tries=halted.output_retries_used,
        )
        result = await engine.drive(RunSpec(loop, toolkit, plan, on_tools_done=on_tools_done))
        await self._after_resume(halted, result)
        return result

    async def run_with_answer(
        self,
        history: Sequence[Message],
        toolkit: ToolRegistry,
        *,
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
            AnswerMismatchError: ``answer.id`` is not ``pending.id``.
            UsageError: ``history`` is not a halted transcript.
        """
        engine = self.engine
        plan = plan_from_transcript(history, pending, answer)
        loop = engine.resumed_loop(plan.turn, run_id=None)
        return await engine.drive(RunSpec(loop, toolkit, plan))
