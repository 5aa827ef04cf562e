"""The sans-IO run loop (toolnexus_async/_core/loop.py and loop_state.py), driven with
plain calls and no event loop."""

from __future__ import annotations

import pytest

from toolnexus_async import (
    AssistantMessage,
    Message,
    ModelReply,
    Request,
    RunResult,
    SystemMessage,
    ToolCall,
    ToolResult,
    ToolReturn,
    Usage,
    UsageError,
    UserMessage,
)
from toolnexus_async._core.loop import CallModel, CallOutcome, Finish, HaltedTurn, RunLoop, RunTools
from toolnexus_async._core.messages import unpaired_calls


def calls_reply(
    *calls: ToolCall,
    text: str | None = None,
    usage: Usage | None = None,
    model: str | None = None,
) -> ModelReply:
    """A model reply asking for ``calls``."""
    return ModelReply(AssistantMessage(text, calls), usage or Usage(), model)


def text_reply(text: str, *, usage: Usage | None = None, model: str | None = None) -> ModelReply:
    """A final model reply."""
    return ModelReply(AssistantMessage(text), usage or Usage(), model)


def ok(text: str) -> CallOutcome:
    return CallOutcome(ToolResult.ok(text))


def suspended(request_id: str, prompt: str = "approve?") -> CallOutcome:
    return CallOutcome(ToolResult.pending(Request(request_id, "approval", prompt)))


def expect_call_model(loop: RunLoop) -> CallModel:
    action = loop.next_action()
    assert isinstance(action, CallModel), action
    return action


def expect_run_tools(loop: RunLoop) -> RunTools:
    action = loop.next_action()
    assert isinstance(action, RunTools), action
    return action


def expect_finish(loop: RunLoop) -> Finish:
    action = loop.next_action()
    assert isinstance(action, Finish), action
    return action


def one_tool_turn(loop: RunLoop, call_id: str) -> None:
    """Play one model request that asks for one tool, and its ok result."""
    expect_call_model(loop)
    loop.model_replied(calls_reply(ToolCall(call_id, "t")))
    expect_run_tools(loop)
    loop.tools_finished([ok(f"result {call_id}")])


# --- starting a run -------------------------------------------------------------------------


def test_first_action_calls_the_model_with_the_prompt_as_turn_one():
    """A new run asks for model request number 1 carrying the user's prompt."""
    loop = RunLoop("hello")
    action = expect_call_model(loop)
    assert action.turn == 1
    assert list(action.messages) == [UserMessage("hello")]
    assert loop.turns == 0


def test_system_prompt_goes_first():
    """The system prompt is the first message, before history and the prompt."""
    history: list[Message] = [UserMessage("earlier"), AssistantMessage("reply")]
    loop = RunLoop("now", history=history, system_prompt="Be brief.")
    assert list(expect_call_model(loop).messages) == [
        SystemMessage("Be brief."),
        UserMessage("earlier"),
        AssistantMessage("reply"),
        UserMessage("now"),
    ]


def test_system_prompt_is_not_doubled_when_history_starts_with_one():
    """A history that already opens with a system message keeps it; none is added."""
    history: list[Message] = [SystemMessage("Old rules."), UserMessage("earlier")]
    loop = RunLoop("now", history=history, system_prompt="New rules.")
    assert list(expect_call_model(loop).messages) == [
        SystemMessage("Old rules."),
        UserMessage("earlier"),
        UserMessage("now"),
    ]


def test_no_prompt_continues_the_history_as_is():
    """prompt=None adds no user message (a resumed run)."""
    history: list[Message] = [UserMessage("q")]
    loop = RunLoop(None, history=history)
    assert list(expect_call_model(loop).messages) == [UserMessage("q")]


def test_history_is_not_mutated():
    """The caller's history list is copied, not appended to."""
    history: list[Message] = [UserMessage("earlier")]
    loop = RunLoop("now", history=history)
    loop.model_replied(text_reply("fine"))
    assert history == [UserMessage("earlier")]


def test_history_ending_with_unpaired_calls_is_refused():
    """A history whose last assistant calls lack results is refused with UsageError naming them."""
    history: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (ToolCall("c1", "pay"), ToolCall("c2", "mail"))),
        ToolReturn("c1", "pay", "paid"),
    ]
    with pytest.raises(UsageError, match=r"mail \(c2\)") as info:
        RunLoop("next", history=history)
    assert "pay (c1)" not in str(info.value)


def test_history_with_paired_calls_is_accepted():
    """A history in which every call has its result starts normally."""
    history: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (ToolCall("c1", "pay"),)),
        ToolReturn("c1", "pay", "paid"),
        AssistantMessage("done"),
    ]
    loop = RunLoop("next", history=history)
    assert list(expect_call_model(loop).messages) == [*history, UserMessage("next")]


def test_history_with_unpaired_calls_before_a_user_message_is_refused():
    """Unpaired calls anywhere break the pairing invariant, even if a user message follows."""
    history: list[Message] = [
        UserMessage("go"),
        AssistantMessage(None, (ToolCall("c1", "pay"),)),
        UserMessage("hello?"),
    ]
    with pytest.raises(UsageError, match=r"pay \(c1\)"):
        RunLoop("next", history=history)


@pytest.mark.parametrize("max_turns", [0, -1])
def test_max_turns_below_one_is_refused(max_turns: int):
    """A run must be allowed at least one model request."""
    with pytest.raises(UsageError, match="max_turns"):
        RunLoop("hi", max_turns=max_turns)


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


def test_a_record_keeps_the_tools_own_result():
    """The record of a call holds the result the tool gave, not a copy made later."""
    loop = RunLoop("x")
    loop.model_replied(calls_reply(ToolCall("c1", "t")))
    given = ToolResult.ok("fine")
    loop.tools_finished([CallOutcome(given)])
    loop.model_replied(text_reply("done"))
    assert expect_finish(loop).result.tool_calls[0].result is given


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


# --- turn counting and max_turns ------------------------------------------------------------


def test_max_turns_three_allows_exactly_three_requests():
    """max_turns=3 allows three model requests; the run then ends incomplete, turns == 3."""
    loop = RunLoop("loop", max_turns=3)
    for n in (1, 2, 3):
        action = expect_call_model(loop)
        assert action.turn == n
        loop.model_replied(calls_reply(ToolCall(f"c{n}", "t")))
        assert loop.turns == n
        expect_run_tools(loop)
        loop.tools_finished([ok(f"r{n}")])
    result = expect_finish(loop).result
    assert result.status == "incomplete"
    assert result.limit == "max_turns"
    assert result.turns == 3


def test_last_allowed_turn_still_runs_its_tools():
    """The calls of the last allowed turn are executed and paired before the run stops."""
    loop = RunLoop("loop", max_turns=1)
    loop.model_replied(calls_reply(ToolCall("c1", "t"), ToolCall("c2", "u")))
    run = expect_run_tools(loop)
    assert [c.id for c in run.calls] == ["c1", "c2"]
    loop.tools_finished([ok("one"), ok("two")])
    result = expect_finish(loop).result
    assert result.status == "incomplete"
    assert result.limit == "max_turns"
    assert result.turns == 1
    assert result.messages[-2:] == (ToolReturn("c1", "t", "one"), ToolReturn("c2", "u", "two"))
    assert [r.id for r in result.tool_calls] == ["c1", "c2"]


def test_final_text_on_the_last_allowed_turn_is_done_not_incomplete():
    """Answering on the last allowed request is a normal finish."""
    loop = RunLoop("q", max_turns=2)
    one_tool_turn(loop, "c1")
    expect_call_model(loop)
    loop.model_replied(text_reply("answer"))
    result = expect_finish(loop).result
    assert result.status == "done"
    assert result.limit is None
    assert result.turns == 2


def test_incomplete_run_text_is_the_last_assistant_text():
    """An incomplete run reports the last thing the model said."""
    loop = RunLoop("q", max_turns=1)
    loop.model_replied(calls_reply(ToolCall("c1", "t"), text="Working on it."))
    loop.tools_finished([ok("x")])
    assert expect_finish(loop).result.text == "Working on it."


def test_default_max_turns_is_ten():
    """Without max_turns a run may make ten model requests, not eleven."""
    loop = RunLoop("q")
    for n in range(1, 11):
        one_tool_turn(loop, f"c{n}")
    result = expect_finish(loop).result
    assert result.status == "incomplete"
    assert result.turns == 10


def test_turns_count_requests_made():
    """loop.turns counts replies fed in; the next CallModel announces turns + 1."""
    loop = RunLoop("q", max_turns=5)
    one_tool_turn(loop, "c1")
    one_tool_turn(loop, "c2")
    assert loop.turns == 2
    assert expect_call_model(loop).turn == 3


# --- pairing and order ----------------------------------------------------------------------


def test_results_enter_the_transcript_in_tool_call_order():
    """Whatever the executor's finishing order, outcomes are given and stored in call order."""
    loop = RunLoop("q")
    calls = (ToolCall("a", "t1"), ToolCall("b", "t2"), ToolCall("c", "t3"))
    loop.model_replied(calls_reply(*calls))
    loop.tools_finished([ok("A"), ok("B"), ok("C")])
    assert loop.messages[-3:] == [
        ToolReturn("a", "t1", "A"),
        ToolReturn("b", "t2", "B"),
        ToolReturn("c", "t3", "C"),
    ]
    assert [r.id for r in loop.records] == ["a", "b", "c"]


def test_records_keep_what_each_tool_returned():
    """A result with metadata is kept as it came; a plain one is recorded equal to it."""
    loop = RunLoop("q", max_turns=3)
    tagged = ToolResult.ok("A", {"source": "cache"})
    loop.model_replied(calls_reply(ToolCall("a", "t1"), ToolCall("b", "t2")))
    loop.tools_finished([CallOutcome(tagged), CallOutcome(ToolResult.error("B"))])
    loop.model_replied(calls_reply(ToolCall("c", "t3")))
    loop.tools_finished([ok("C")])
    records = loop.records
    assert records[0].result is tagged
    assert [(r.id, r.turn, r.result) for r in records] == [
        ("a", 1, tagged),
        ("b", 1, ToolResult.error("B")),
        ("c", 2, ToolResult.ok("C")),
    ]
    assert loop.records is records  # asking again builds nothing new


def test_exactly_one_result_per_call_before_the_next_model_request():
    """Each CallModel after a tool turn sees one ToolReturn per call of that turn, no more."""
    loop = RunLoop("q", max_turns=4)
    for turn in range(3):
        expect_call_model(loop)
        loop.model_replied(calls_reply(ToolCall(f"x{turn}", "t"), ToolCall(f"y{turn}", "t")))
        loop.tools_finished([ok("1"), ok("2")])
    messages = list(expect_call_model(loop).messages)
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            following = messages[index + 1 : index + 1 + len(message.tool_calls)]
            assert [m.call_id for m in following if isinstance(m, ToolReturn)] == [
                c.id for c in message.tool_calls
            ]
    returns = [m.call_id for m in messages if isinstance(m, ToolReturn)]
    assert sorted(returns) == sorted(set(returns))
    assert len(returns) == 6


@pytest.mark.parametrize("count", [0, 1, 3])
def test_wrong_number_of_outcomes_is_refused(count: int):
    """Feeding more or fewer outcomes than calls raises, and nothing is recorded."""
    loop = RunLoop("q")
    loop.model_replied(calls_reply(ToolCall("a", "t"), ToolCall("b", "t")))
    with pytest.raises(UsageError, match="expected 2 tool outcomes"):
        loop.tools_finished([ok(str(i)) for i in range(count)])
    assert loop.records == []
    assert isinstance(loop.next_action(), RunTools)


# --- suspension -----------------------------------------------------------------------------


def test_first_suspended_call_in_call_order_wins():
    """With b and c suspended, the run halts on b's request even if c finished first."""
    loop = RunLoop("q")
    calls = (ToolCall("a", "t"), ToolCall("b", "t"), ToolCall("c", "t"))
    loop.model_replied(calls_reply(*calls))
    # Outcomes are reported in call order; c might have finished first, it does not matter.
    loop.tools_finished([ok("fine"), suspended("req-b", "B?"), suspended("req-c", "C?")])
    result = expect_finish(loop).result
    assert result.status == "pending"
    assert result.pending is not None
    assert result.pending.id == "req-b"
    assert result.pending.prompt == "B?"


def test_suspended_lists_every_suspended_call_in_order():
    """RunResult.suspended holds each suspended call of the halted turn with its request."""
    loop = RunLoop("q")
    calls = (ToolCall("a", "t"), ToolCall("b", "u"), ToolCall("c", "v"), ToolCall("d", "w"))
    loop.model_replied(calls_reply(*calls))
    loop.tools_finished([suspended("r-a"), ok("b"), suspended("r-c"), ok("d")])
    result = expect_finish(loop).result
    assert [(r.id, r.request.id if r.request else None) for r in result.suspended] == [
        ("a", "r-a"),
        ("c", "r-c"),
    ]
    assert result.pending is not None and result.pending.id == "r-a"
    assert [r.id for r in result.tool_calls] == ["a", "b", "c", "d"]


def test_pending_run_keeps_completed_results_and_leaves_suspended_calls_unanswered():
    """A halted turn keeps the results of completed calls; suspended calls stay unanswered."""
    loop = RunLoop("q")
    calls = (ToolCall("a", "t"), ToolCall("b", "t"), ToolCall("c", "t"))
    loop.model_replied(calls_reply(*calls))
    loop.tools_finished([suspended("r-a"), ok("x"), suspended("r-c")])
    result = expect_finish(loop).result

    assert result.messages[-2:] == (AssistantMessage(None, calls), ToolReturn("b", "t", "x"))
    halted = HaltedTurn.of(result.messages)
    assert halted.open == (calls[0], calls[2])
    assert halted.completed == {"b": ToolReturn("b", "t", "x")}
    assert [c.id for c in unpaired_calls(result.messages)] == ["a", "c"]


def test_pending_on_the_last_allowed_turn_is_pending_not_incomplete():
    """A suspension halts the run as pending even when max_turns is also reached."""
    loop = RunLoop("q", max_turns=1)
    loop.model_replied(calls_reply(ToolCall("a", "t")))
    loop.tools_finished([suspended("r-a")])
    result = expect_finish(loop).result
    assert result.status == "pending"
    assert result.limit is None


def test_resolved_suspension_is_not_a_halt():
    """An outcome that suspended but was resolved (final result not pending) goes on."""
    loop = RunLoop("q")
    request = Request("r1", "approval", "ok?")
    loop.model_replied(calls_reply(ToolCall("a", "t")))
    loop.tools_finished([CallOutcome(ToolResult.ok("paid"), request, True)])
    assert isinstance(loop.next_action(), CallModel)
    (record,) = loop.records
    assert record.request is request
    assert record.answered_ok is True
    assert loop.messages[-1] == ToolReturn("a", "t", "paid")


def test_declined_suspension_is_an_error_result_not_a_halt():
    """A declined answer becomes an error result for the model; the run continues."""
    loop = RunLoop("q")
    request = Request("r1", "approval", "ok?")
    loop.model_replied(calls_reply(ToolCall("a", "t")))
    loop.tools_finished([CallOutcome(ToolResult.error("declined/expired: ok?"), request, False)])
    assert isinstance(loop.next_action(), CallModel)
    assert loop.messages[-1] == ToolReturn("a", "t", "declined/expired: ok?", True)
    assert loop.records[0].answered_ok is False


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


# --- a reply cut by the output limit --------------------------------------------------------


@pytest.mark.parametrize("reason", ["length", "max_tokens"])
def test_a_reply_cut_by_the_output_limit_finishes_incomplete_without_its_calls(reason: str):
    """Rule 5: openai's "length" and anthropic's "max_tokens" end the run incomplete with
    limit "max_tokens"; the text stays, the calls are neither run nor kept."""
    loop = RunLoop("write a file")
    expect_call_model(loop)
    cut = ModelReply(
        AssistantMessage("Writing it.", (ToolCall("c1", "make_file", {}, '{"name": "ta'),)),
        Usage(5, 7, 12),
        stop_reason=reason,
    )
    kept = loop.model_replied(cut)
    assert kept == AssistantMessage("Writing it.")
    result = expect_finish(loop).result
    assert (result.status, result.limit, result.text) == ("incomplete", "max_tokens", "Writing it.")
    assert result.messages[-1] == kept and unpaired_calls(result.messages) == []
    assert result.tool_calls == () and result.usage == Usage(5, 7, 12)


@pytest.mark.parametrize("reason", [None, "stop", "end_turn", "tool_calls", "tool_use"])
def test_other_stop_reasons_leave_the_calls_to_run(reason: str | None):
    """Only a cut by the limit holds the calls back."""
    loop = RunLoop("go")
    expect_call_model(loop)
    reply = ModelReply(AssistantMessage(None, (ToolCall("c1", "t"),)), stop_reason=reason)
    assert loop.model_replied(reply) == reply.message
    assert expect_run_tools(loop).calls == (ToolCall("c1", "t"),)


def test_a_paused_reply_is_kept_and_the_model_asked_to_go_on():
    """Rule 6: pause_turn asks the model again, from its own reply, within max_turns."""
    loop = RunLoop("search", max_turns=2)
    expect_call_model(loop)
    paused = AssistantMessage("Searching...")
    assert loop.model_replied(ModelReply(paused, stop_reason="pause_turn")) == paused
    action = expect_call_model(loop)
    assert (action.turn, action.messages[-1]) == (2, paused)
    loop.model_replied(ModelReply(AssistantMessage("Found it."), stop_reason="end_turn"))
    result = expect_finish(loop).result
    assert (result.status, result.text, result.turns) == ("done", "Found it.", 2)
    # A model that pauses for ever is stopped by max_turns.
    loop = RunLoop("search", max_turns=1)
    expect_call_model(loop)
    loop.model_replied(ModelReply(paused, stop_reason="pause_turn"))
    stopped = expect_finish(loop).result
    assert (stopped.status, stopped.limit) == ("incomplete", "max_turns")
