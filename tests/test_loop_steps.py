"""The sans-IO run loop, fed step by step: a plain run's actions and records, the usage
and model its result reports, and feeding it out of turn (refused) or asking it twice
(the same answer); plain calls, no event loop."""

from __future__ import annotations

import pytest

from tests.loop_feed import (
    calls_reply,
    expect_call_model,
    expect_finish,
    expect_run_tools,
    ok,
    text_reply,
)
from toolnexus_async import (
    AssistantMessage,
    ModelReply,
    Request,
    RunResult,
    ToolCall,
    ToolCallRecord,
    ToolResult,
    ToolReturn,
    Usage,
    UsageError,
    UserMessage,
)
from toolnexus_async._core.loop import CallOutcome, Finish, RunLoop, RunTools

# --- a plain run ----------------------------------------------------------------------------


def test_text_reply_finishes_done():
    """A reply without tool calls ends the run: done, its text, one turn."""
    loop = RunLoop("hi")
    loop.model_replied(text_reply("Hello!", model="m-1", usage=Usage(3, 2, 5)))
    result = expect_finish(loop).result
    assert result.status == "done"
    assert result.text == "Hello!"
    assert result.turns == 1
    assert result.model == "m-1"
    assert result.usage == Usage(3, 2, 5)
    assert result.pending is None
    assert result.limit is None
    assert result.messages == (UserMessage("hi"), AssistantMessage("Hello!"))


def test_text_of_a_reply_without_text_is_empty():
    """A final reply with no text gives text == ""."""
    loop = RunLoop("hi")
    loop.model_replied(ModelReply(AssistantMessage(None)))
    assert expect_finish(loop).result.text == ""


def test_tool_turn_then_text():
    """Calls are run, their results join the transcript, then the model is asked again."""
    loop = RunLoop("add")
    call = ToolCall("c1", "add", {"a": 1, "b": 2})
    expect_call_model(loop)
    loop.model_replied(calls_reply(call, text="Adding."))
    run = expect_run_tools(loop)
    assert run.calls == (call,)
    assert run.turn == 1
    loop.tools_finished([ok("3")])
    second = expect_call_model(loop)
    assert second.turn == 2
    assert list(second.messages) == [
        UserMessage("add"),
        AssistantMessage("Adding.", (call,)),
        ToolReturn("c1", "add", "3", False),
    ]
    loop.model_replied(text_reply("It is 3."))
    result = expect_finish(loop).result
    assert result.status == "done"
    assert result.text == "It is 3."
    assert result.turns == 2
    assert [(r.id, r.name, r.arguments, r.result, r.turn) for r in result.tool_calls] == [
        ("c1", "add", {"a": 1, "b": 2}, ToolResult.ok("3"), 1)
    ]


def test_due_says_what_next_action_says_without_an_action():
    """due(): None for a model request, the calls for a tool turn, the result at the end;
    the engine drives with it, so it must agree with next_action at every step."""
    loop = RunLoop("add", max_turns=2)
    call = ToolCall("c1", "add", {"a": 1, "b": 2})
    assert loop.due() is None and expect_call_model(loop).turn == loop.turns + 1
    loop.model_replied(calls_reply(call))
    assert loop.due() == (call,) == expect_run_tools(loop).calls
    loop.tools_finished([ok("3")])
    assert loop.due() is None
    loop.model_replied(calls_reply(ToolCall("c2", "add", {"a": 3, "b": 4})))
    loop.tools_finished([ok("7")])
    result = loop.due()  # max_turns reached: the run is over
    assert isinstance(result, RunResult) and result.limit == "max_turns"
    assert loop.due() is result is expect_finish(loop).result


class Tagged(ToolResult):
    """A result of a type of its own, which a record must keep as it came."""


def test_a_plain_calls_record_is_made_when_the_records_are_asked_for():
    """The loop keeps no record for a plain call (no metadata, of ToolResult itself,
    nothing else to say) until the records are asked for, so that a run in flight holds
    fewer objects; a result with metadata or of a subclass is recorded at once. Every
    record holds the result the tool gave."""
    loop = RunLoop("x")
    loop.model_replied(calls_reply(ToolCall("c1", "t"), ToolCall("c2", "t"), ToolCall("c3", "t")))
    plain, tagged, own = ToolResult.ok("fine"), ToolResult.ok("meta", {"k": 1}), Tagged("mine")
    loop.tools_finished([CallOutcome(plain), tagged, own])
    kept = [entry for entry in loop._kept if isinstance(entry, ToolCallRecord)]
    assert [record.result for record in kept] == [tagged, own]
    loop.model_replied(text_reply("done"))
    first, second, third = expect_finish(loop).result.tool_calls
    assert first.result is plain and second.result is tagged and third.result is own
    assert [r.turn for r in (first, second, third)] == [1, 1, 1]


def test_a_bare_result_is_an_outcome_with_nothing_else_to_say():
    """tools_finished takes a ToolResult for CallOutcome(result), mixed with outcomes."""
    loop = RunLoop("x")
    asked = Request("r1", "approval", "ok?")
    loop.model_replied(calls_reply(ToolCall("c1", "t"), ToolCall("c2", "t")))
    loop.tools_finished([ToolResult.ok("one"), CallOutcome(ToolResult.ok("two"), asked, True)])
    assert [m.output for m in loop.messages[-2:]] == ["one", "two"]  # type: ignore[union-attr]
    first, second = loop.records
    assert (first.result, first.request, first.answered_ok) == (ToolResult.ok("one"), None, None)
    assert (second.request, second.answered_ok) == (asked, True)


def test_error_results_keep_their_flag_in_the_transcript():
    """An error result becomes a ToolReturn with is_error True and the output unchanged."""
    loop = RunLoop("x")
    loop.model_replied(calls_reply(ToolCall("c1", "t")))
    loop.tools_finished([CallOutcome(ToolResult.error("tool 't' raised ValueError: no"))])
    assert loop.messages[-1] == ToolReturn("c1", "t", "tool 't' raised ValueError: no", True)


# --- usage and model ------------------------------------------------------------------------


def test_usage_is_summed_over_turns():
    """Each reply's usage is added to the run's total."""
    loop = RunLoop("q")
    loop.model_replied(calls_reply(ToolCall("a", "t"), usage=Usage(10, 2, 12)))
    loop.tools_finished([ok("x")])
    loop.model_replied(text_reply("done", usage=Usage(15, 4, 19)))
    assert expect_finish(loop).result.usage == Usage(25, 6, 31)


def test_model_is_the_last_one_reported():
    """RunResult.model is the model of the last reply that named one."""
    loop = RunLoop("q")
    loop.model_replied(calls_reply(ToolCall("a", "t"), model="m-1"))
    loop.tools_finished([ok("x")])
    loop.model_replied(calls_reply(ToolCall("b", "t"), model="m-2"))
    loop.tools_finished([ok("x")])
    loop.model_replied(text_reply("done"))
    assert expect_finish(loop).result.model == "m-2"


def test_model_is_none_when_never_reported():
    """No reply named a model: model is None."""
    loop = RunLoop("q")
    loop.model_replied(text_reply("done"))
    assert expect_finish(loop).result.model is None


# --- misuse and idempotence -----------------------------------------------------------------


def test_feeding_tool_outcomes_when_a_model_reply_is_expected_raises():
    """tools_finished before any model reply is misuse."""
    loop = RunLoop("q")
    with pytest.raises(UsageError, match="expects a model reply"):
        loop.tools_finished([])


def test_feeding_a_model_reply_when_tool_outcomes_are_expected_raises():
    """model_replied while calls are outstanding is misuse, and the turn is not counted."""
    loop = RunLoop("q")
    loop.model_replied(calls_reply(ToolCall("a", "t")))
    with pytest.raises(UsageError, match="expects tool outcomes"):
        loop.model_replied(text_reply("skip"))
    assert loop.turns == 1
    assert isinstance(loop.next_action(), RunTools)


def test_feeding_anything_after_the_finish_raises():
    """A finished run accepts nothing more."""
    loop = RunLoop("q")
    loop.model_replied(text_reply("done"))
    with pytest.raises(UsageError, match="finished"):
        loop.model_replied(text_reply("again"))
    with pytest.raises(UsageError, match="finished"):
        loop.tools_finished([])
    assert expect_finish(loop).result.turns == 1


def test_feeding_a_reply_after_max_turns_raises():
    """Once max_turns is reached the loop refuses another reply."""
    loop = RunLoop("q", max_turns=1)
    loop.model_replied(calls_reply(ToolCall("a", "t")))
    loop.tools_finished([ok("x")])
    expect_finish(loop)
    with pytest.raises(UsageError):
        loop.model_replied(text_reply("late"))


def test_next_action_is_idempotent():
    """Asking for the next action twice without feeding anything returns the same action."""
    loop = RunLoop("q", max_turns=1)
    assert loop.next_action() == loop.next_action()
    loop.model_replied(calls_reply(ToolCall("a", "t")))
    assert loop.next_action() == loop.next_action()
    loop.tools_finished([ok("x")])
    first = loop.next_action()
    second = loop.next_action()
    assert isinstance(first, Finish)
    assert first == second
    assert first.result is second.result
    assert loop.turns == 1


def test_finished_result_does_not_change_after_the_finish():
    """The RunResult of a finished run is a fixed value (its transcript is a tuple)."""
    loop = RunLoop("q")
    loop.model_replied(text_reply("done"))
    result = expect_finish(loop).result
    assert isinstance(result.messages, tuple)
    assert isinstance(result.tool_calls, tuple)
