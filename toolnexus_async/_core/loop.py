"""The run loop as a sans-IO state machine.

Rule of this module: it decides, it never waits. No coroutine, no clock, no socket: the
client asks :meth:`RunLoop.next_action` what to do, does it, and feeds the outcome back
(:meth:`RunLoop.model_replied`, :meth:`RunLoop.tools_finished`). Everything here can be
tested with plain function calls.

This module owns how a run advances: the actions, and the rules below. What the loop holds,
how one is made (new, :meth:`~LoopState.resume`, :meth:`~LoopState.restore`) and the
:class:`RunResult` made of it (a snapshot, the run's end) are its base's,
:class:`LoopState` in ``loop_state.py``.

Theory of operation::

    CallModel --model_replied--> cut by the output limit? --yes--> Finish(incomplete,
        ^                            | no                              limit="max_tokens")
        |                        tool calls? --no--> Finish(done)
        |                            | yes
        |                            v
        |                        RunTools --tools_finished--> suspended? --yes--> Finish(pending)
        |                                                | no
        +------------- yes -- turns < max_turns? <-------+
                                     | no
                                     v
                      Finish(incomplete, limit="max_turns")

Rules kept here, each pinned by a test in ``tests/test_loop.py``:

1. A turn is one model request; ``turns`` counts requests made; ``max_turns`` caps them.
   The tool calls of the last allowed turn still run, so the transcript stays paired.
2. Tool results enter the transcript in tool-call order, whatever order they finished in.
3. Every tool call gets exactly one result before the next model request.
4. A result that is still a suspension halts the run: ``status == "pending"`` with the
   request of the **first** suspended call in tool-call order. The halted transcript keeps
   the results of the calls that completed and leaves the suspended ones unanswered, so it
   is enough, with the answer, to resume the run (:class:`HaltedTurn`).
5. A reply cut by the model's output limit (``stop_reason`` ``"length"`` or
   ``"max_tokens"``) ends the run ``"incomplete"`` with ``limit == "max_tokens"``. Its text
   is kept; its tool calls are not run and not kept: the last one is cut short, and no call
   is acted on from a reply that did not end.
6. A reply that paused (anthropic ``stop_reason`` ``"pause_turn"``: a long server tool
   turn) is sent back as it is, and the model asked again to go on: another turn, within
   ``max_turns``. The paused reply's text stays in the transcript; the run's ``text`` is
   the last reply's, as always.
7. A run with an :class:`OutputSpec` ends only on a valid output (judged by
   ``output_rule``, acted on here): the final reply (or, in the ``"tool"`` method, its call
   of the output tool) is read by the spec. An invalid one
   is answered with the errors (a user message, or the output tool's error result) and the
   model asked again, up to ``retries`` times, within ``max_turns``; past that the run
   ends ``"incomplete"`` with ``limit == "output_invalid"`` and :attr:`RunLoop.output_failure`
   says why (the engine raises it as :class:`OutputValidationError`). A refusal ends the
   run ``"done"`` with no output: it is never read as an invalid reply. The output tool's
   call is answered in the transcript (which stays paired) and never executed, nor are the
   other calls of its reply. The retries used are part of every result, so a run that
   halts and is resumed goes on with those it has left, not with ``retries`` afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from .errors import UsageError
from .fastinit import builder
from .halted import HaltedTurn
from .loop_state import MODEL, NO_RECORDS, TOOLS, Expect, LoopState, make_record
from .messages import AssistantMessage, Message, ModelReply, ToolCall, ToolReturn, UserMessage
from .output_rule import judge_reply
from .results import RunResult
from .types import Request, ToolResult, request_in

__all__ = (
    "CallModel",
    "CallOutcome",
    "Finish",
    "HaltedTurn",
    "RunLoop",
    "RunTools",
)


# The loop's own messages to and from its driver, made several times per run: plain slotted
# classes, since a frozen attrs class pays for every field it sets (treat them as frozen).


@attrs.define
class CallOutcome:
    """What became of one tool call: its final result and, if it suspended, the request."""

    result: ToolResult
    request: Request | None = None
    answered_ok: bool | None = None
    # What the tool was given instead of the model's arguments (a hook or an approver changed
    # them); None when it got the model's.
    changed_arguments: dict[str, Any] | None = None


@attrs.define
class CallModel:
    """Send ``messages`` to the model; this will be request number ``turn``."""

    messages: Sequence[Message]
    turn: int


@attrs.define
class RunTools:
    """Execute ``calls`` (concurrently) and report one outcome per call, in this order."""

    calls: tuple[ToolCall, ...]
    turn: int


@attrs.define
class Finish:
    """The run is over."""

    result: RunResult


Action = CallModel | RunTools | Finish


# A tool call's transcript entry, built by its fast_init builder (every field by position,
# init=False ones too): no type.__call__ and no move to the twin in __init__, one per call
# (issue 41, park41h in performance.md).
_tool_return: Callable[[str, str, str, bool, Literal["tool"]], ToolReturn]
_tool_return = builder(ToolReturn)


# The stop reasons of a reply cut by the model's output limit: openai's finish_reason,
# anthropic's stop_reason.
CUT_BY_LIMIT = frozenset({"length", "max_tokens"})


class RunLoop(LoopState):
    """The state of one run (:class:`LoopState`), advanced by the outcomes the caller feeds
    in."""

    __slots__ = ()

    def next_action(self) -> Action:
        """What the caller must do next. Asking twice without feeding anything is harmless."""
        due = self.due()
        if due is None:
            return CallModel(self.messages, self.turns + 1)
        if isinstance(due, tuple):
            return RunTools(due, self.turns)
        return Finish(due)

    def due(self) -> tuple[ToolCall, ...] | RunResult | None:
        """:meth:`next_action` without an object to say it, for a driver that asks at every
        step (the engine): ``None`` when the model request is due (number ``turns + 1``, of
        ``messages``), the calls of turn ``turns`` when they are, the result when the run
        is over. One object fewer per step (issue 41, fourth pass in performance.md)."""
        if self._result is not None:
            return self._result
        if self._expect is TOOLS:
            return self._calls
        if self.turns >= self.max_turns:
            return self._finish("incomplete", limit="max_turns")
        return None

    def interrupted(self, limit: str = "model_error") -> RunResult:
        """The run as it stands while a model request is due (e.g. after that request failed).

        ``status == "incomplete"`` with the given ``limit``; the loop itself is unchanged.
        """
        self._check(MODEL)
        result = self._finish("incomplete", limit=limit)
        self._expect, self._result = MODEL, None
        return result

    def model_replied(self, reply: ModelReply) -> AssistantMessage:
        """Feed the model's reply to the request :meth:`next_action` asked for; returns the
        message the transcript keeps (a cut reply's without its tool calls)."""
        if self._expect is not MODEL:
            self._check(MODEL)
        self.turns += 1
        self.usage = self.usage + reply.usage
        if reply.model is not None:
            self.model = reply.model
        message = reply.message
        if reply.stop_reason in CUT_BY_LIMIT:
            if message.tool_calls:
                message = attrs.evolve(message, tool_calls=())
            self.messages.append(message)
            self._finish("incomplete", limit="max_tokens")
            return message
        self.messages.append(message)
        if self.output is not None and self._read_output(message, reply.stop_reason):
            return message
        if message.tool_calls:
            self._calls = message.tool_calls
            self._expect = TOOLS
        elif reply.stop_reason != "pause_turn":
            self._finish("done")
        # else: paused, the model goes on from its own reply at the next request
        return message

    def _read_output(self, message: AssistantMessage, stop_reason: str | None) -> bool:
        """Act on rule 7's verdict on the reply (``output_rule``); True when it settled
        what happens next (the run finished, or the model is asked to correct itself)."""
        spec = self.output
        assert spec is not None
        verdict = judge_reply(spec, message, stop_reason)
        if verdict is None:
            return False
        self.messages.extend(verdict.answered)
        if verdict.error is None:
            self._finish("done", output=verdict.output)
            return True
        return self._retry_output(verdict.raw, verdict.error, told=bool(verdict.answered))

    def _retry_output(self, raw: str, error: str, *, told: bool) -> bool:
        spec = self.output
        assert spec is not None
        if self._output_tries >= spec.retries:
            self.output_failure = (raw, error)
            self._finish("incomplete", limit="output_invalid")
            return True
        self._output_tries += 1
        if not told:
            self.messages.append(UserMessage(spec.feedback(error)))
        # The next action asks the model again (or ends the run at max_turns).
        return True

    def tools_finished(self, outcomes: Sequence[CallOutcome | ToolResult]) -> None:
        """Feed one outcome per tool call, in the order :class:`RunTools` listed the calls.
        A bare :class:`ToolResult` is an outcome with nothing else to say (the usual call:
        the executor makes no :class:`CallOutcome` for it)."""
        if self._expect is not TOOLS:
            self._check(TOOLS)
        calls = self._calls
        if len(outcomes) != len(calls):
            raise UsageError(f"expected {len(calls)} tool outcomes, got {len(outcomes)}")
        kept = self._kept
        if kept is NO_RECORDS:
            kept = self._kept = []
        turn = self.turns
        suspended = False
        # By index: no enumerate and no tuple iterator, two objects the collector tracks
        # fewer per turn.
        for index in range(len(calls)):
            call, outcome = calls[index], outcomes[index]
            if isinstance(outcome, CallOutcome):
                result, request = outcome.result, outcome.request
                answered_ok, changed = outcome.answered_ok, outcome.changed_arguments
            else:
                result, request, answered_ok, changed = outcome, None, None, None
            # No metadata, no suspension: the usual result needs no call to tell.
            still = None if result.metadata is None else request_in(result)
            if still is None:
                self.messages.append(
                    _tool_return(call.id, call.name, result.output, result.is_error, "tool")
                )
                if (
                    result.metadata is None
                    and request is None
                    and answered_ok is None
                    and changed is None
                    and type(result) is ToolResult
                ):
                    kept += (turn, call, result)  # its record made when asked for (Kept)
                    continue
            else:
                suspended = True
            record = make_record(call, result, turn, request or still, answered_ok, changed)
            kept += (record, None, None)
        self._calls = ()
        if suspended:
            # The suspended calls stay without a result: the transcript alone says where the
            # run stands, and the run resumes from exactly here once a request is answered.
            these = self.records[-len(calls) :]
            halted = tuple(r for r in these if request_in(r.result) is not None)
            self._finish("pending", pending=request_in(halted[0].result), suspended=halted)
            return
        self._expect = MODEL

    def _check(self, expected: Expect) -> None:
        if self._expect is not expected:
            raise UsageError(f"the loop expects {self._expect.value}, not {expected.value}")
