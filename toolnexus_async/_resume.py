"""Resuming a halted run: which call gets which answer, and the client's ``resume``.

Rules of this module:

- Planning is pure (no I/O): every answer must echo an outstanding request of the halted
  turn, else :class:`AnswerMismatchError` before anything runs; two answers for one request, or
  none at all, are a :class:`UsageError`. From a transcript alone, the answer belongs to
  the first unanswered call: that is the call ``RunResult.pending`` always comes from.
- A plan becomes a resumed :class:`RunLoop`, driven like any other run by the client's
  runner; what an answer then does to its call is the suspension rule's business
  (``_suspension.py``: a late "yes" to an expired request counts as expired, there too).
- Keeping halted runs in a store, claiming them and putting them back is the durable
  host's (``durable/_host.py``), not this module's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import AnswerMismatchError, UsageError
from ._ids import new_run_id
from ._loop import HaltedTurn, RunLoop
from ._messages import ZERO_USAGE, Message
from ._results import RunResult
from ._toolkit import Toolkit
from ._types import Answer, Request, ToolResult
from ._wire import approval_claim, claim_refusal

__all__ = ("ResumePlan", "Resuming", "plan_from_transcript", "plan_resume")


@attrs.frozen
class ResumePlan:
    """The halted turn, the answer for each answered call (by call id), kept results, and
    the calls that wait for their unanswered request again (a durable resume)."""

    turn: HaltedTurn
    answers: dict[str, tuple[Request, Answer]]
    kept: dict[str, ToolResult] = attrs.field(factory=dict)
    waiting: dict[str, Request] = attrs.field(factory=dict)


def _answers_in(answers: object) -> list[Answer]:
    """``answers`` as a list, or a :class:`UsageError` saying what was expected."""
    expected = "resume(halted, toolkit, answers) takes an Answer or a list of Answers as answers"
    if isinstance(answers, Answer):
        return [answers]
    if isinstance(answers, Iterable) and not isinstance(answers, str | bytes | dict):
        given = list(answers)
        for answer in given:
            if not isinstance(answer, Answer):
                raise UsageError(
                    f"{expected}, got a {type(answer).__name__} among them: build each "
                    f"with Answer(request.id, ok=True), or Answer.from_dict(payload)"
                )
        return given
    raise UsageError(
        f"{expected}, got {type(answers).__name__} {answers!r:.40}: build one with "
        f"Answer(halted.pending.id, ok=True), or Answer.from_dict(payload)"
    )


def plan_resume(halted: RunResult, answers: Answer | Iterable[Answer]) -> ResumePlan:
    """The plan for :meth:`LlmClient.resume`; raises before anything is executed."""
    if halted.status != "pending" or not halted.suspended:
        raise UsageError(f"only a halted run can be resumed; this one is {halted.status!r}")
    given = _answers_in(answers)
    if not given:
        raise UsageError("resume needs at least one answer")
    outstanding = {r.request.id: r for r in halted.suspended if r.request is not None}
    by_call: dict[str, tuple[Request, Answer]] = {}
    for answer in given:
        record = outstanding.get(answer.id)
        if record is None or record.request is None:
            raise AnswerMismatchError(
                answer.id,
                f"answer {answer.id!r} matches no outstanding request of run "
                f"{halted.run_id or '?'}; outstanding: {', '.join(outstanding) or 'none'}",
            )
        if record.call.id in by_call:
            raise UsageError(f"two answers for request {answer.id!r}")
        mismatch = claim_refusal(record.request, approval_claim(answer))
        if mismatch is not None:
            raise mismatch
        by_call[record.call.id] = (record.request, answer)
    kept = {r.call.id: r.result for r in halted.tool_calls if r.turn == halted.turns}
    return ResumePlan(HaltedTurn.of(halted.messages), by_call, kept)


def plan_from_transcript(
    history: Sequence[Message], pending: Request, answer: Answer
) -> ResumePlan:
    """The plan for :meth:`LlmClient.run_with_answer`: the first open call gets the answer."""
    if answer.id != pending.id:
        raise AnswerMismatchError(
            answer.id, f"answer {answer.id!r} does not echo the pending request {pending.id!r}"
        )
    mismatch = claim_refusal(pending, approval_claim(answer))
    if mismatch is not None:
        raise mismatch
    turn = HaltedTurn.of(history)
    return ResumePlan(turn, {turn.open[0].id: (pending, answer)})


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
        toolkit: Toolkit,
        answers: Answer | Iterable[Answer],
        *,
        on_tools_done: Callable[[RunResult], Any] | None = None,
    ) -> RunResult:
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

        Raises:
            AnswerMismatchError: an answer echoes no outstanding request; nothing was executed.
            UsageError: ``halted`` is not a halted run, no answer was given, or two answers
                share an id.
        """
        self._check_open()
        given: object = toolkit  # typed as a Toolkit, but callers swap arguments
        if not isinstance(given, Toolkit):
            swapped = " (the arguments look swapped)" if isinstance(answers, Toolkit) else ""
            raise UsageError(
                f"resume(halted, toolkit, answers) takes a Toolkit second, got "
                f"{type(given).__name__}{swapped}: the answers come third"
            )
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
        history: Sequence[Message],
        toolkit: Toolkit,
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
