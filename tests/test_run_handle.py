"""`client.start(...)`: a run held by a handle, with its id from the start, what it waits
on, its result, and cancellation that leaves nothing behind."""

from __future__ import annotations

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    Answer,
    AssistantMessage,
    Inbox,
    LlmClient,
    Request,
    RunCancelledError,
    RunHandle,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
)


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay, once approved."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount}?"))
    return ToolResult.ok("paid")


def model(messages, tools):
    returns = [m for m in messages if isinstance(m, ToolReturn)]
    if returns:
        return returns[-1].output
    return AssistantMessage(None, (ToolCall("c1", "pay", {"amount": 5}),))


async def parked(inbox: Inbox) -> Request:
    """The next request the inbox parks (the run announces it; no polling)."""
    async for request in inbox.requests():
        return request
    raise AssertionError("unreachable")


async def test_the_handle_knows_its_run_before_and_while_it_waits():
    inbox = Inbox()
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as tk,
        LlmClient.in_process(model, wait_for=inbox) as client,
    ):
        arrivals = inbox.requests()
        async with client.start("pay 5", tk, run_id="order-17") as run:
            assert isinstance(run, RunHandle)
            assert run.id == "order-17"
            request = await anext(arrivals)
            waiting = run.status, run.pending
            assert waiting == ("waiting", (request,))
            assert inbox.run_of(request.id) == run.id
            assert inbox.pending(run_id=run.id) == [request]
            assert inbox.pending(run_id="another") == []
            await inbox.answer(Answer(request.id, ok=True))
            result = await run.result()
        await arrivals.aclose()
    assert (result.status, result.text, result.run_id) == ("done", "paid", "order-17")
    assert (run.status, run.pending, run.done()) == ("done", (), True)
    assert_no_leaks()


async def test_a_halted_run_says_what_it_halted_on():
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as tk,
        LlmClient.in_process(model) as client,
        client.start("pay 5", tk) as run,
    ):
        result = await run.result()
    assert result.status == run.status == "pending"
    assert run.pending == (result.pending,)
    assert run.id == result.run_id and run.id  # a generated id
    assert_no_leaks()


async def test_cancel_stops_a_parked_run_and_unparks_it():
    inbox = Inbox()
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as tk,
        LlmClient.in_process(model, wait_for=inbox) as client,
    ):
        arrivals = inbox.requests()
        async with client.start("pay 5", tk) as run:
            await anext(arrivals)
            run.cancel()
            with pytest.raises(RunCancelledError, match=run.id):
                await run.result()
        await arrivals.aclose()
    assert run.status == "cancelled" and run.done()
    assert len(inbox) == 0  # nothing stays parked for a run that is gone
    assert_no_leaks()


async def test_leaving_the_block_by_an_exception_cancels_the_run():
    inbox = Inbox()
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as tk,
        LlmClient.in_process(model, wait_for=inbox) as client,
    ):
        arrivals = inbox.requests()
        with pytest.raises(KeyError):
            async with client.start("pay 5", tk) as run:
                await anext(arrivals)
                raise KeyError("the handler failed")
        await arrivals.aclose()
    assert run.status == "cancelled"
    assert len(inbox) == 0
    assert_no_leaks()


def broken(messages, tools):
    raise ValueError("the model broke")


async def test_a_failed_run_raises_from_result_or_from_the_block():
    async with Toolkit.create(builtins=False) as tk, LlmClient.in_process(broken) as client:
        async with client.start("hi", tk) as run:
            with pytest.raises(ValueError, match="the model broke"):
                await run.result()
        assert run.status == "failed"
        with pytest.raises(ValueError, match="the model broke"):  # never lost
            async with client.start("hi", tk):
                pass
    assert_no_leaks()


async def test_leaving_the_block_normally_waits_for_the_run():
    inbox = Inbox()
    async with (
        Toolkit.create(builtins=False, extra_tools=[pay]) as tk,
        LlmClient.in_process(model, wait_for=inbox) as client,
        anyio.create_task_group() as tg,
    ):

        async def approve_next() -> None:
            request = await parked(inbox)
            await inbox.answer(Answer(request.id, ok=True))

        tg.start_soon(approve_next)
        await anyio.wait_all_tasks_blocked()  # the approver listens before the run parks
        async with client.start("pay 5", tk) as run:
            pass
        assert run.status == "done"
    assert_no_leaks()


async def test_misuse_is_refused():
    async with Toolkit.create(builtins=False) as tk, LlmClient.in_process(model) as client:
        run = client.start("hi", tk)
        assert run.status == "starting"
        with pytest.raises(UsageError, match="async with"):
            await run.result()
        async with run:
            with pytest.raises(UsageError, match="once"):
                await run.__aenter__()
    with pytest.raises(UsageError, match="closed"):
        client.start("hi", tk)
