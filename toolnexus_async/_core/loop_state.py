"""What a run loop holds, how one is made, and the :class:`RunResult` made of it.

Rule of this module: it owns the run's state and its passage to and from a
:class:`RunResult`, never how the run advances (``loop.py``'s :class:`RunLoop`, which
inherits this). A loop is made new (a prompt after a history), resumed (from a halted turn,
expecting its tool outcomes) or restored (from a :meth:`LoopState.snapshot`, its next
request due); what it hands back is a snapshot of a run in progress or the run's end
(``_finish``), built here once, by position.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, Self

from .errors import UsageError
from .fastinit import builder
from .halted import HaltedTurn
from .messages import (
    ZERO_USAGE,
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    Usage,
    UserMessage,
    unpaired_calls,
)
from .output import OutputSpec
from .records import ToolCallRecord
from .results import RunResult, RunStatus
from .types import Request, ToolResult

__all__ = ("LoopState", "make_record")


# A run's prompt and its end, built by their fast_init builders (every field by position,
# init=False ones too): no type.__call__ and no move to the twin in __init__ (issue 41,
# park41h in performance.md).
_user_message: Callable[[str, Literal["user"]], UserMessage] = builder(UserMessage)
_run_result: Callable[..., RunResult] = builder(RunResult)

# What a loop keeps of its calls' records (``LoopState._kept``): three entries per call, in
# call order. For a call whose outcome was a plain ToolResult (no metadata, of ToolResult
# itself, nothing else to say of it) they are its turn, its ToolCall and that result, and
# its record is made when the records are asked for (at the run's end, a snapshot, a
# halt); for any other call, its ToolCallRecord, None, None. So a run in flight keeps no
# record per plain call between its model requests: with 500 runs at once, the objects
# they hold rise and fall less with each wave, the collector makes fewer young collections,
# and on Python 3.11 a timed round of overhead.py stays under the full collection's line
# (issue 41's seventh pass in docs/performance.md).
Kept = ToolCallRecord | ToolCall | ToolResult | int | None


def _kept_of(records: Iterable[ToolCallRecord]) -> list[Kept]:
    """``records`` as a loop keeps them."""
    return [entry for record in records for entry in (record, None, None)]


# Never appended to (see LoopState._kept).
NO_RECORDS: list[Kept] = []

# A plain result and a call's record, by their fast_init builders (as the loop's own values).
_result: Callable[[str, bool, dict[str, Any] | None], ToolResult] = builder(ToolResult)
make_record: Callable[
    [ToolCall, ToolResult, int, Request | None, bool | None, dict[str, Any] | None],
    ToolCallRecord,
] = builder(ToolCallRecord)


class Expect(enum.Enum):
    """What the loop waits to be fed next."""

    MODEL = "a model reply"
    TOOLS = "tool outcomes"
    NOTHING = "nothing (the run is finished)"


# The members as globals: on Python 3.11, whose EnumType has a __getattr__ (3.12 dropped
# it), each read off the class goes through that hook and makes a method-wrapper object,
# about a dozen times a run. With this and client.py's alike: 1,510,199 instructions per
# run against 1,530,525 and 1,529,783 (benchmarks/instructions.py --quick, 3.11.7).
MODEL, TOOLS, NOTHING = Expect.MODEL, Expect.TOOLS, Expect.NOTHING


class LoopState:
    """The state of one run: its transcript, counters, records and what it expects next."""

    # Slots: every parked run holds one RunLoop, and a __dict__ each adds up. RunLoop adds
    # none of its own, so it has no __dict__ either.
    __slots__ = (
        "_calls",
        "_expect",
        "_kept",
        "_output_tries",
        "_result",
        "max_turns",
        "messages",
        "model",
        "output",
        "output_failure",
        "run_id",
        "style",
        "trace",
        "turns",
        "usage",
    )

    def __init__(
        self,
        prompt: str | None,
        history: Sequence[Message] = (),
        system_prompt: str | None = None,
        max_turns: int = 10,
        run_id: str = "",
        style: str | None = None,
        output: OutputSpec | None = None,
    ) -> None:
        if max_turns < 1:
            raise UsageError(f"max_turns must be at least 1, got {max_turns}")
        unpaired = unpaired_calls(history) if history else ()
        if unpaired:
            names = ", ".join(f"{c.name} ({c.id})" for c in unpaired)
            raise UsageError(
                f"history ends with tool calls that have no result: {names}; "
                "resume a halted run instead of starting a new one from it"
            )
        messages: list[Message] = list(history)
        if system_prompt is not None and not (messages and isinstance(messages[0], SystemMessage)):
            messages.insert(0, SystemMessage(system_prompt))
        if prompt is not None:
            messages.append(_user_message(prompt, "user"))
        self.messages = messages
        self.max_turns = max_turns
        self.run_id = run_id
        self.style = style
        self.turns = 0
        self.usage = ZERO_USAGE
        self.model: str | None = None
        # What makes the records of the calls so far (see Kept). Shared until the first
        # tool call: a run parked in its first turn holds no list.
        self._kept: list[Kept] = NO_RECORDS
        self._expect = MODEL
        self._calls: tuple[ToolCall, ...] = ()
        self._result: RunResult | None = None
        # The run's trace context, opaque here: set by a traced engine, kept in every
        # result (so in a stored run) and handed to the loop of its resume.
        self.trace: dict[str, str] | None = None
        self.output = output
        self._output_tries = 0
        # (the raw reply, what is wrong with it) once the output retries are spent.
        self.output_failure: tuple[str, str] | None = None

    @classmethod
    def resume(
        cls,
        halted: HaltedTurn,
        *,
        turns: int,
        usage: Usage,
        model: str | None,
        records: Sequence[ToolCallRecord],
        max_turns: int = 10,
        run_id: str = "",
        style: str | None = None,
        trace: dict[str, str] | None = None,
        output: OutputSpec | None = None,
        output_tries: int = 0,
    ) -> Self:
        """A loop that continues a halted run: it expects the halted turn's tool outcomes.

        The halted turn's results (the kept ones and the new ones) enter the transcript in
        tool-call order, exactly one per call, and no new user message is added.
        ``output_tries``: the output retries the run had used before it halted.
        """
        loop = cls(None, max_turns=max_turns, run_id=run_id, style=style, output=output)
        loop._output_tries = output_tries
        loop.messages = list(halted.before)
        loop.messages.append(halted.assistant)
        loop.turns = turns
        loop.usage = usage
        loop.model = model
        loop._kept = _kept_of(r for r in records if r.turn < turns)
        loop._calls = halted.assistant.tool_calls
        loop._expect = TOOLS
        loop.trace = trace
        return loop

    @classmethod
    def restore(
        cls, state: RunResult, *, max_turns: int = 10, output: OutputSpec | None = None
    ) -> Self:
        """A loop that goes on from ``state`` (a :meth:`snapshot`) with no turn in
        progress: its next action is the model request after ``state.messages``. Its output
        spec is ``output``, else the state's."""
        loop = cls(
            None,
            max_turns=max_turns,
            run_id=state.run_id,
            style=state.style,
            output=output if output is not None else state.output_spec,
        )
        loop.messages = list(state.messages)
        loop.turns = state.turns
        loop.usage = state.usage
        loop.model = state.model
        loop._kept = _kept_of(state.tool_calls)
        loop.trace = state.trace_context
        loop._output_tries = state.output_retries_used
        return loop

    @property
    def records(self) -> list[ToolCallRecord]:
        """A :class:`ToolCallRecord` for every executed call so far, in call order (a plain
        call's made now, equal each time it is asked for)."""
        entries: Iterator[Any] = iter(self._kept)
        # Three entries at a time (see Kept): zip over one iterator, no slice per call.
        return [
            first if second is None else make_record(second, third, first, None, None, None)
            for first, second, third in zip(entries, entries, entries, strict=True)
        ]

    def snapshot(self) -> RunResult:
        """The run as it stands (``status == "incomplete"``, ``limit == "running"``): its
        transcript through the current turn, its counters and the records of its calls.
        What a durable host keeps; the loop is unchanged."""
        return RunResult(
            status="incomplete",
            text="",
            messages=tuple(self.messages),
            tool_calls=tuple(self.records),
            turns=self.turns,
            usage=self.usage,
            model=self.model,
            limit="running",
            run_id=self.run_id,
            style=self.style,
            trace_context=self.trace,
            output_spec=self.output,
            output_retries_used=self._output_tries,
        )

    def _finish(
        self,
        status: RunStatus,
        *,
        limit: str | None = None,
        pending: Request | None = None,
        suspended: tuple[ToolCallRecord, ...] = (),
        output: tuple[Any, Any] = (None, None),
    ) -> RunResult:
        """End the run: nothing more is expected, and its result is kept and returned."""
        text = ""
        refusal = None
        messages = self.messages
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if isinstance(message, AssistantMessage):
                text, refusal = message.text or "", message.refusal
                break
        self._expect = NOTHING
        if self.output is None and status == "done" and refusal is None:
            output = (text, None)  # a run without an output type: its text is its output
        # By position, in the order of RunResult's fields: keywords would make a dict.
        # tests/test_loop_state.py's field-order test fails if that order changes under this.
        self._result = _run_result(
            status,
            text,
            tuple(self.messages),
            tuple(self.records),  # tool_calls
            self.turns,
            self.usage,
            self.model,
            pending,
            limit,
            suspended,
            self.run_id,
            self.style,
            refusal,
            self.trace,  # trace_context
            output[0],
            output[1],  # output_data
            self.output,  # output_spec
            self._output_tries,  # output_retries_used
        )
        return self._result
