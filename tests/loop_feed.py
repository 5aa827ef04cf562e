"""Feeding the sans-IO run loop by hand, for the ``test_loop*.py`` files: model replies,
call outcomes, the action expected next, and one whole tool turn."""

from __future__ import annotations

from toolnexus_async import (
    AssistantMessage,
    ModelReply,
    Request,
    ToolCall,
    ToolResult,
    Usage,
)
from toolnexus_async._core.loop import CallModel, CallOutcome, Finish, RunLoop, RunTools


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
