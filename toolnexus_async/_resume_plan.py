"""Which call of a halted turn gets which answer: the pure half of resuming a run.

Rules of this module (no I/O; the client executes the plan):

- Every answer must echo an outstanding request of the halted turn, else
  :class:`AnswerMismatch` before anything runs; two answers for one request, or none at
  all, are a :class:`UsageError`.
- An answer to a request whose ``expires_at`` has passed counts as
  ``Answer(ok=False, reason="expired")`` (DESIGN section 3.4), even a late "yes".
- From a transcript alone, the answer belongs to the first unanswered call: that is the
  call ``RunResult.pending`` always comes from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from ._errors import AnswerMismatch, UsageError
from ._loop import HaltedTurn
from ._messages import Message
from ._results import RunResult
from ._types import Answer, Request, ToolResult

__all__ = ("ResumePlan", "plan_from_transcript", "plan_resume")


@attrs.frozen
class ResumePlan:
    """The halted turn, the answer for each answered call (by call id), and kept results."""

    turn: HaltedTurn
    answers: dict[str, tuple[Request, Answer]]
    kept: dict[str, ToolResult] = attrs.field(factory=dict)


def _unless_expired(request: Request, answer: Answer) -> Answer:
    if answer.ok and request.expired():
        return Answer(answer.id, False, reason="expired")
    return answer


def plan_resume(halted: RunResult, answers: Answer | Iterable[Answer]) -> ResumePlan:
    """The plan for :meth:`LlmClient.resume`; raises before anything is executed."""
    if halted.status != "pending" or not halted.suspended:
        raise UsageError(f"only a halted run can be resumed; this one is {halted.status!r}")
    given = [answers] if isinstance(answers, Answer) else list(answers)
    if not given:
        raise UsageError("resume needs at least one answer")
    outstanding = {r.request.id: r for r in halted.suspended if r.request is not None}
    by_call: dict[str, tuple[Request, Answer]] = {}
    for answer in given:
        record = outstanding.get(answer.id)
        if record is None or record.request is None:
            raise AnswerMismatch(
                answer.id,
                f"answer {answer.id!r} matches no outstanding request of run "
                f"{halted.run_id or '?'}; outstanding: {', '.join(outstanding) or 'none'}",
            )
        if record.call.id in by_call:
            raise UsageError(f"two answers for request {answer.id!r}")
        by_call[record.call.id] = (record.request, _unless_expired(record.request, answer))
    kept = {r.call.id: r.result for r in halted.tool_calls if r.turn == halted.turns}
    return ResumePlan(HaltedTurn.of(halted.messages), by_call, kept)


def plan_from_transcript(
    history: Sequence[Message], pending: Request, answer: Answer
) -> ResumePlan:
    """The plan for :meth:`LlmClient.run_with_answer`: the first open call gets the answer."""
    if answer.id != pending.id:
        raise AnswerMismatch(
            answer.id, f"answer {answer.id!r} does not echo the pending request {pending.id!r}"
        )
    turn = HaltedTurn.of(history)
    return ResumePlan(turn, {turn.open[0].id: (pending, _unless_expired(pending, answer))})
