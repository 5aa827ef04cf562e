"""What a parked run holds: the await chain of a run parked on an Inbox (issue 41).

A run parked in a turn of two tool calls awaits, from its task down: the engine's one
frame for the run and the inbox's slot. The call that waits is the last (awaited by that
frame itself once the first finished); it hands the request it waits for back to the
engine, which waits for the answer itself. No frame of ``LlmClient.run``, of ``Executor.run``,
of ``Executor.run_one`` or of the turn's concurrency helper, nor the turn's executor, the
call's rule or an object carrying the call: each would be held by every parked run.
"""

from __future__ import annotations

import asyncio
import types

import anyio

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    Answer,
    AssistantMessage,
    Hooks,
    Inbox,
    LlmClient,
    Message,
    Request,
    Tool,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)
from toolnexus_async._core.suspension import CallRule
from toolnexus_async._engine.executor import Executor

LIMIT = 5


def two_calls(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
    """Turn 1: a call that finishes at once, then one that asks; turn 2: the results."""
    if isinstance(messages[-1], UserMessage):
        return AssistantMessage(
            None, (ToolCall("c1", "look", {"city": "Paris"}), ToolCall("c2", "pay", {"n": 7}))
        )
    assert isinstance(messages[-1], ToolReturn)
    return AssistantMessage(" | ".join(m.output for m in messages if isinstance(m, ToolReturn)))


async def look(city: str) -> str:
    """Look a city up.

    Args:
        city: the city.
    """
    return f"{city}: 21 C"


async def pay(n: int, ctx: ToolContext) -> ToolResult:
    """Pay invoice n, once approved.

    Args:
        n: the invoice.
    """
    if ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {n}?"))
    return ToolResult.ok(f"paid {n}")


def chain(awaited: object) -> list[str]:
    """What ``awaited`` awaits, and what that awaits, down to the future: their names."""
    names: list[str] = []
    while awaited is not None:
        if isinstance(awaited, types.CoroutineType):
            names.append(awaited.cr_code.co_qualname)
            awaited = awaited.cr_await
        elif isinstance(awaited, types.GeneratorType):
            names.append(awaited.gi_code.co_qualname)
            awaited = awaited.gi_yieldfrom
        elif isinstance(awaited, asyncio.Future):
            names.append(type(awaited).__name__)
            awaited = None
        else:
            names.append(type(awaited).__name__)
            awaited = getattr(awaited, "_job", None)
    return names


async def test_a_parked_run_holds_the_engine_frame_the_waiting_call_and_the_slot() -> None:
    inbox = Inbox()
    async with (
        Toolkit.create(builtins=False, extra_tools=[define_tool(look), define_tool(pay)]) as tk,
        LlmClient.in_process(two_calls, wait_for=inbox) as client,
    ):
        with anyio.fail_after(LIMIT):
            task = asyncio.create_task(client.run("go", tk))
            request = await anext(aiter(inbox.requests()))
            coro = task.get_coro()
            assert chain(coro) == ["Engine._drive", "FutureIter"]  # the inbox slot's
            assert isinstance(coro, types.CoroutineType) and coro.cr_frame is not None
            held = coro.cr_frame.f_locals.values()
            assert not any(isinstance(value, Executor) for value in held)
            assert not any(isinstance(value, CallRule) for value in held)
            await inbox.answer(Answer(request.id, True))
            result = await task
    assert result.text == "Paris: 21 C | paid 7"
    assert_no_leaks()


async def test_a_hooks_own_request_waits_in_the_calls_frame_and_stays_the_hooks() -> None:
    """A ``before_tool`` hook that asks with a request of its own (no gate's mark) cannot
    have its rule rebuilt from the request alone: the call waits in ``run_one``, and once
    approved the hook sees the answer and the tool, which never asked, does not."""
    inbox = Inbox()
    seen: list[tuple[str, Answer | None]] = []

    def confirm(name: str, args: dict[str, object], ctx: ToolContext) -> ToolResult | None:
        if name != "pay":
            return None
        seen.append(("hook", ctx.answer))
        if ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"Run {name}?"))
        return None

    async def pay(n: int, ctx: ToolContext) -> str:
        """Pay invoice n.

        Args:
            n: the invoice.
        """
        seen.append(("tool", ctx.answer))
        return f"paid {n}"

    async with (
        Toolkit.create(builtins=False, extra_tools=[define_tool(look), define_tool(pay)]) as tk,
        LlmClient.in_process(two_calls, wait_for=inbox, hooks=Hooks(before_tool=confirm)) as client,
    ):
        with anyio.fail_after(LIMIT):
            task = asyncio.create_task(client.run("go", tk))
            request = await anext(aiter(inbox.requests()))
            assert chain(task.get_coro()) == ["Engine._drive", "Executor.run_one", "FutureIter"]
            answer = Answer(request.id, True)
            await inbox.answer(answer)
            result = await task
    assert result.text == "Paris: 21 C | paid 7"
    assert seen == [("hook", None), ("hook", answer), ("tool", None)]
    assert_no_leaks()
