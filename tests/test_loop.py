"""The sans-IO run loop (toolnexus_async/_core/loop.py and loop_state.py), driven with
plain calls and no event loop: the rules ``_core/loop.py`` numbers (turns and
``max_turns``, results in call order, one result per call, the first suspension halting the
run, a reply cut by the output limit, a paused reply). How a run starts is
``test_loop_start.py``'s; a plain run's steps, what its result reports and misuse are
``test_loop_steps.py``'s."""

from __future__ import annotations

import pytest

from tests.loop_feed import (
    calls_reply,
    expect_call_model,
    expect_finish,
    expect_run_tools,
    ok,
    one_tool_turn,
    suspended,
    text_reply,
)
from toolnexus_async import (
    AssistantMessage,
    ModelReply,
    Request,
    ToolCall,
    ToolResult,
    ToolReturn,
    Usage,
    UsageError,
)
from toolnexus_async._core.loop import CallModel, CallOutcome, HaltedTurn, RunLoop, RunTools
from toolnexus_async._core.messages import unpaired_calls

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
    assert loop.records == records  # asked again: equal


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
