"""The sans-IO run loop, started: the prompt, the system prompt, a history given (never
changed, its calls paired) and ``max_turns`` checked; plain calls, no event loop."""

from __future__ import annotations

import pytest

from tests.loop_feed import expect_call_model, text_reply
from toolnexus_async import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolReturn,
    UsageError,
    UserMessage,
)
from toolnexus_async._core.loop import RunLoop

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
