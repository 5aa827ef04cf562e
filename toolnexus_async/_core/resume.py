"""Resuming a halted run: which call gets which answer, and the client's ``resume``.

Rules of this module:

- Planning is pure (no I/O): every answer must echo an outstanding request of the halted
  turn, else :class:`AnswerMismatchError` before anything runs; two answers for one request, or
  none at all, are a :class:`UsageError`. From a transcript alone, the answer belongs to
  the first unanswered call: that is the call ``RunResult.pending`` always comes from.
- A plan becomes a resumed :class:`RunLoop`, driven like any other run by the engine
  (``_engine/resuming.py`` does it for the client); what an answer then does to its call is the
  suspension rule's business (``_core/suspension.py``: a late "yes" to an expired request
  counts as expired, there too).
- Keeping halted runs in a store, claiming them and putting them back is the durable
  host's (``durable/_host.py``), not this module's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .errors import AnswerMismatchError, UsageError
from .loop import HaltedTurn
from .messages import Message
from .results import RunResult
from .types import Answer, Request, ToolResult
from .wire import approval_claim, claim_refusal

__all__ = ("ResumePlan", "plan_from_transcript", "plan_resume")


@attrs.frozen
class ResumePlan:
    """The halted turn, the answer for each answered call (by call id), kept results, and
    the calls that wait for their unanswered request again (a durable resume).

    ``waited``: for an answered call of a stored run, when its request was raised and when
    the answer was taken (seconds since the epoch; the second ``None`` when not known), as
    the store kept them; a traced resume spans each wait over them. A call waited for again
    has its raise time there too (and ``None``): its wait's span starts then, not when this
    worker took the run over.
    """

    turn: HaltedTurn
    answers: dict[str, tuple[Request, Answer]]
    kept: dict[str, ToolResult] = attrs.field(factory=dict)
    waiting: dict[str, Request] = attrs.field(factory=dict)
    waited: dict[str, tuple[float, float | None]] = attrs.field(factory=dict)


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
