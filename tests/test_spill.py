"""Hot parking with spill to disk: a run parked longer than park_timeout halts into the
store, and an answer later resumes it; the host answers the same way either way."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    Answer,
    HaltRun,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    StoreError,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
)
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.testing import reply, tool_call


class Pay:
    """A tool that needs approval and counts its executions."""

    def __init__(self) -> None:
        self.answers: list[str] = []

        @define_tool(name="pay")
        async def pay(ctx: ToolContext | None = None) -> ToolResult:
            """Pay, once approved."""
            if ctx is None or ctx.answer is None:
                return ToolResult.pending(Request("", "approval", "pay?"))
            self.answers.append(ctx.answer.id)
            return ToolResult.ok("paid")

        self.toolkit = Toolkit.create(builtins=False, extra_tools=[pay])


def model(messages: list[Message], tools: list[Any]) -> Any:
    """Calls pay, then reports its result."""
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(tool_call("pay", id="c1"))


async def wait_until(predicate: Any) -> None:
    while not predicate():
        await anyio.lowlevel.checkpoint()


async def test_a_run_parked_too_long_halts_into_the_store_and_resumes_on_answer():
    """park_timeout: the run returns pending, its memory is gone, the answer resumes it."""
    store = MemoryRunStore()
    results: list[RunResult] = []

    async def on_result(result: RunResult) -> None:
        results.append(result)

    pay = Pay()
    inbox = Inbox(park_timeout=0.02, store=store, on_result=on_result)
    with anyio.fail_after(5):
        async with inbox, LlmClient.in_process(model, wait_for=inbox) as client:
            halted = await client.run("pay", pay.toolkit)
            assert halted.status == "pending"
            assert len(inbox) == 0
            assert halted.pending is not None
            request_id = halted.pending.id
            assert (await store.load(request_id)).run_id == halted.run_id
            inbox.answer(Answer(request_id, True))
            await wait_until(lambda: bool(results))
    assert results[0].status == "done"
    assert results[0].text == "result: paid"
    assert results[0].run_id == halted.run_id
    assert pay.answers == [request_id]
    assert len(store) == 0
    assert_no_leaks()


async def test_an_answer_while_the_run_is_being_saved_is_kept():
    """An answer between the spill and the end of the save resumes the run afterwards."""
    store = MemoryRunStore()
    saving = anyio.Event()
    release = anyio.Event()
    results: list[RunResult] = []

    class SlowStore(MemoryRunStore):
        async def save(self, run: RunResult) -> None:
            saving.set()
            await release.wait()
            await store.save(run)

        async def claim(self, request_id: str) -> RunResult:
            return await store.claim(request_id)

    async def on_result(result: RunResult) -> None:
        results.append(result)

    pay = Pay()
    inbox = Inbox(park_timeout=0.02, store=SlowStore(), on_result=on_result)
    with anyio.fail_after(5):
        async with inbox, LlmClient.in_process(model, wait_for=inbox) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.run, "pay", pay.toolkit)
                await saving.wait()
                (request_id,) = inbox._spilled
                inbox.answer(Answer(request_id, True))
                release.set()
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"
    assert pay.answers == [request_id]


async def test_after_a_restart_restore_makes_stored_runs_answerable():
    """A new Inbox over the same store resumes runs spilled by an earlier one."""
    store = MemoryRunStore()
    pay = Pay()
    first = Inbox(park_timeout=0.02, store=store)
    with anyio.fail_after(5):
        async with first, LlmClient.in_process(model, wait_for=first) as client:
            halted = await client.run("pay", pay.toolkit)
    assert halted.pending is not None

    results: list[RunResult] = []

    async def on_result(result: RunResult) -> None:
        results.append(result)

    second = Inbox(store=store, on_result=on_result)
    with anyio.fail_after(5):
        async with second, LlmClient.in_process(model, wait_for=second) as client:
            assert await second.restore(client, pay.toolkit) == 1
            second.answer(Answer(halted.pending.id, True))
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"


async def test_answering_a_spilled_run_needs_the_inbox_open_and_changes_nothing_otherwise():
    """Without `async with inbox` there is no task group to resume in: UsageError, no change."""
    store = MemoryRunStore()
    pay = Pay()
    inbox = Inbox(park_timeout=0.02, store=store)
    with anyio.fail_after(5):
        async with inbox, LlmClient.in_process(model, wait_for=inbox) as client:
            halted = await client.run("pay", pay.toolkit)
    assert halted.pending is not None
    with pytest.raises(UsageError, match="async with inbox"):
        inbox.answer(Answer(halted.pending.id, True))
    assert (await store.load(halted.pending.id)).run_id == halted.run_id
    assert pay.answers == []


def test_park_timeout_needs_a_store():
    """Spilling with nowhere to spill to is refused up front."""
    with pytest.raises(UsageError, match="store"):
        Inbox(park_timeout=1)


async def test_a_wait_for_may_raise_haltrun_to_halt_the_run():
    """HaltRun from any wait_for halts the run as pending instead of an error result."""

    def give_up(request: Request) -> Answer:
        raise HaltRun("not now")

    pay = Pay()
    async with LlmClient.in_process(model, wait_for=give_up) as client:
        result = await client.run("pay", pay.toolkit)
    assert result.status == "pending"
    assert result.pending is not None and result.pending.kind == "approval"
    assert pay.answers == []


async def test_a_store_failure_on_claim_keeps_the_request_answerable():
    """A claim that fails with a store error neither crashes the inbox nor loses the run:
    the next answer to the same request resumes it."""
    store = MemoryRunStore()
    results: list[RunResult] = []
    failures = [StoreError("database is locked")]

    class Flaky(MemoryRunStore):
        async def save(self, run: RunResult) -> None:
            await store.save(run)

        async def claim(self, request_id: str) -> RunResult:
            if failures:
                raise failures.pop()
            return await store.claim(request_id)

    async def on_result(result: RunResult) -> None:
        results.append(result)

    pay = Pay()
    inbox = Inbox(park_timeout=0.02, store=Flaky(), on_result=on_result)
    with anyio.fail_after(5):
        async with inbox, LlmClient.in_process(model, wait_for=inbox) as client:
            halted = await client.run("pay", pay.toolkit)
            assert halted.pending is not None
            inbox.answer(Answer(halted.pending.id, True))
            await wait_until(
                lambda: halted.pending is not None and halted.pending.id in inbox._spilled
            )
            inbox.answer(Answer(halted.pending.id, True))
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"
    assert pay.answers == [halted.pending.id]
