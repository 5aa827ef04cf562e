"""The durable host: a run parked longer than park_timeout halts into the store, a run with
nobody to ask halts there at once, and one answer call resumes either; parked runs wake in
memory. The Inbox only parks; the host keeps and resumes."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    Answer,
    DurableHost,
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
    UnknownRequestError,
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
    pay = Pay()
    inbox = Inbox(park_timeout=0.02)
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model, wait_for=inbox) as client,
            DurableHost(client, pay.toolkit, store, on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.status == "pending"
            assert len(inbox) == 0
            assert halted.pending is not None
            request_id = halted.pending.id
            assert (await store.load(request_id)).run_id == halted.run_id
            assert await host.requests() == [halted.pending]
            await host.answer(Answer(request_id, True))
            await wait_until(lambda: bool(results))
            with pytest.raises(AlreadyResumedError):
                await host.answer(Answer(request_id, True))
    assert results[0].status == "done"
    assert results[0].text == "result: paid"
    assert results[0].run_id == halted.run_id
    assert pay.answers == [request_id]
    assert len(store) == 0
    assert_no_leaks()


async def test_a_run_answered_in_time_wakes_in_memory_and_is_never_stored():
    store = MemoryRunStore()
    pay = Pay()
    inbox = Inbox(park_timeout=60)
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model, wait_for=inbox) as client,
            DurableHost(client, pay.toolkit, store) as host,
            anyio.create_task_group() as tg,
        ):
            done: list[RunResult] = []

            async def drive() -> None:
                done.append(await host.run("pay"))

            tg.start_soon(drive)
            await wait_until(lambda: len(inbox) == 1)
            (request,) = await host.requests()
            assert inbox.run_of(request.id) is not None
            await host.answer(Answer(request.id, True))
            await wait_until(lambda: bool(done))
            with pytest.raises(AlreadyAnsweredError):
                await host.answer(Answer(request.id, True))
    assert done[0].text == "result: paid"
    assert len(store) == 0


async def test_without_a_wait_for_every_suspension_is_stored_at_once():
    """A client with nobody to ask: the host keeps each halted run; answering resumes it."""
    store = MemoryRunStore()
    results: list[RunResult] = []
    pay = Pay()
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model) as client,
            DurableHost(client, pay.toolkit, store, on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            assert len(store) == 1
            await host.answer(Answer(halted.pending.id, True))
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"


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

    pay = Pay()
    inbox = Inbox(park_timeout=0.02)
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model, wait_for=inbox) as client,
            DurableHost(client, pay.toolkit, SlowStore(), on_result=results.append) as host,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(host.run, "pay")
                await saving.wait()
                (request_id,) = host._saving
                await host.answer(Answer(request_id, True))
                with pytest.raises(AlreadyAnsweredError):
                    await host.answer(Answer(request_id, True))
                release.set()
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"
    assert pay.answers == [request_id]


async def test_after_a_restart_a_new_host_resumes_stored_runs():
    """A new host over the same store resumes runs halted under an earlier one."""
    store = MemoryRunStore()
    pay = Pay()
    first = Inbox(park_timeout=0.02)
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model, wait_for=first) as client,
            DurableHost(client, pay.toolkit, store) as host,
        ):
            halted = await host.run("pay")
    assert halted.pending is not None

    results: list[RunResult] = []
    second = Inbox()
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model, wait_for=second) as client,
            DurableHost(client, pay.toolkit, store, on_result=results.append) as host,
        ):
            assert await host.requests() == [halted.pending]
            await host.answer(Answer(halted.pending.id, True))
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"


async def test_answering_a_stored_run_needs_the_host_open_and_changes_nothing_otherwise():
    """Without `async with host` there is no task group to resume in: UsageError, no change."""
    store = MemoryRunStore()
    pay = Pay()
    async with LlmClient.in_process(model) as client:
        host = DurableHost(client, pay.toolkit, store)
        async with host:
            halted = await host.run("pay")
        assert halted.pending is not None
        with pytest.raises(UsageError, match="async with host"):
            await host.answer(Answer(halted.pending.id, True))
    assert (await store.load(halted.pending.id)).run_id == halted.run_id
    assert pay.answers == []


async def test_an_unknown_request_is_refused():
    async with LlmClient.in_process(model, wait_for=Inbox()) as client:
        async with DurableHost(client, Pay().toolkit, MemoryRunStore()) as host:
            with pytest.raises(UnknownRequestError):
                await host.answer(Answer("req_nobody", True))
            with pytest.raises(UsageError, match="takes an Answer"):
                await host.answer({"id": "r", "ok": True})  # type: ignore[arg-type]


def test_an_inbox_serves_one_host():
    inbox = Inbox()
    client = LlmClient.in_process(model, wait_for=inbox)
    DurableHost(client, Pay().toolkit, MemoryRunStore())
    with pytest.raises(UsageError, match="another DurableHost"):
        DurableHost(client, Pay().toolkit, MemoryRunStore())


async def test_a_run_halted_outside_the_host_is_the_callers():
    """client.run with the host's inbox, not host.run: the halted run is returned, not
    stored; answering it through the inbox says it halted."""
    store = MemoryRunStore()
    pay = Pay()
    inbox = Inbox(park_timeout=0.02)
    async with LlmClient.in_process(model, wait_for=inbox) as client:
        async with DurableHost(client, pay.toolkit, store):
            halted = await client.run("pay", pay.toolkit)
    assert halted.status == "pending" and halted.pending is not None
    assert len(store) == 0
    with pytest.raises(UnknownRequestError, match="its run halted on it"):
        inbox.answer(Answer(halted.pending.id, True))


def test_park_timeout_must_be_positive():
    with pytest.raises(UsageError, match="park_timeout"):
        Inbox(park_timeout=0)


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


async def test_a_store_failure_on_claim_is_the_callers_and_keeps_the_run():
    """A claim that fails with a store error raises it to whoever answered and loses
    nothing: the next answer to the same request resumes the run."""
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

    pay = Pay()
    with anyio.fail_after(5):
        async with (
            LlmClient.in_process(model) as client,
            DurableHost(client, pay.toolkit, Flaky(), on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            with pytest.raises(StoreError, match="locked"):
                await host.answer(Answer(halted.pending.id, True))
            await host.answer(Answer(halted.pending.id, True))
            await wait_until(lambda: bool(results))
    assert results[0].text == "result: paid"
    assert pay.answers == [halted.pending.id]
