"""The durable host: the store is the source of truth, memory a cache over it.

A run the host drives is kept as it goes (written before anyone is told), parks in the
inbox or halts into the store, and one ``answer`` call (durable before it returns) wakes
it or resumes it, here or on another host over the same store; a host that dies is taken
over once its lease runs out. Nothing here sleeps to synchronise: tests wait for the state
they need, bounded by ``anyio.fail_after``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    HaltRun,
    Inbox,
    LlmClient,
    Message,
    Request,
    RequestExpiredError,
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
from toolnexus_async.durable import (
    DurableHost,
    LeaseLostError,
    MemoryRunStore,
    RunStore,
    SqliteRunStore,
)
from toolnexus_async.testing import reply, tool_call

LIMIT = 30  # a guard against a hang, not a speed check: a loaded CI machine fsyncs slowly


class Pay:
    """A tool that needs approval and records each execution with its idempotency key."""

    def __init__(self, expires_at: str | None = None) -> None:
        self.asked = 0
        self.paid: list[str | None] = []

        @define_tool(name="pay")
        async def pay(ctx: ToolContext | None = None) -> ToolResult:
            """Pay, once approved."""
            if ctx is None or ctx.answer is None:
                self.asked += 1
                return ToolResult.pending(Request("", "approval", "pay?", expires_at=expires_at))
            self.paid.append(ctx.idempotency_key)
            return ToolResult.ok("paid")

        self.toolkit = Toolkit.create(builtins=False, extra_tools=[pay])


def model(messages: list[Message], tools: list[Any]) -> Any:
    """Calls pay, then reports its result."""
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(tool_call("pay", id="c1"))


async def until(condition: Callable[[], Any]) -> None:
    while not condition():
        await anyio.lowlevel.checkpoint()


def host_for(client: LlmClient, pay: Pay, store: RunStore, **kw: Any) -> DurableHost:
    return DurableHost(client, pay.toolkit, store, **{"sweep": 0.02, "poll": 0.02, **kw})


async def test_a_run_parked_too_long_halts_into_the_store_and_resumes_on_answer():
    pay = Pay()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(model, wait_for=Inbox(park_timeout=0.02)) as client,
            host_for(client, pay, store, on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.status == "pending" and halted.pending is not None
            assert await host.requests() == [halted.pending]
            await host.answer(Answer(halted.pending.id, True))
            await until(lambda: bool(results))
            with pytest.raises(AlreadyAnsweredError):
                await host.answer(Answer(halted.pending.id, True))
            (summary,) = await store.runs()
    assert (results[0].status, results[0].text) == ("done", "result: paid")
    assert results[0].run_id == halted.run_id == summary.run_id and summary.status == "done"
    assert pay.asked == 1 and len(pay.paid) == 1
    assert_no_leaks()


async def test_a_request_is_kept_before_anyone_is_told_and_woken_in_memory():
    """When the inbox lists a request the store has it already; the answer wakes the run
    where it waits, and the run ends kept as done."""
    pay = Pay()
    inbox = Inbox()
    seen_in_store: list[bool] = []
    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(model, wait_for=inbox) as client,
            host_for(client, pay, store) as host,
            anyio.create_task_group() as tg,
        ):
            done: list[RunResult] = []

            async def drive() -> None:
                done.append(await host.run("pay"))

            async def watch() -> None:
                async for request in inbox.requests():
                    seen_in_store.append([r.id for r in await store.requests()] == [request.id])
                    return

            tg.start_soon(watch)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(drive)
            await until(lambda: bool(seen_in_store))
            (request,) = inbox.pending()
            await host.answer(Answer(request.id, True))
            await until(lambda: bool(done))
            assert await store.requests() == []
    assert seen_in_store == [True]
    assert done[0].text == "result: paid" and pay.asked == 1


async def test_without_a_wait_for_every_suspension_halts_into_the_store():
    pay = Pay()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(model) as client,
            host_for(client, pay, store, on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            assert [s.run_id for s in await store.outstanding()] == [halted.run_id]
            await host.answer(Answer(halted.pending.id, True))
            await until(lambda: bool(results))
    assert results[0].text == "result: paid"


async def test_a_resumed_run_that_fails_is_told_to_on_failure_and_kept_failed():
    """``on_failure(run_id, error)`` gets the end of a run the host resumed that raised;
    ``on_result`` is not called for it, and the store has it failed."""

    def breaks_after_the_tool(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            raise RuntimeError("the model broke")
        return model(messages, tools)

    pay = Pay()
    results: list[RunResult] = []
    failures: list[tuple[str, BaseException]] = []

    async def failed(run_id: str, error: BaseException) -> None:  # async, as allowed
        failures.append((run_id, error))

    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(breaks_after_the_tool) as client,
            host_for(client, pay, store, on_result=results.append, on_failure=failed) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            await host.answer(Answer(halted.pending.id, True))
            await until(lambda: bool(failures))
            (summary,) = [r for r in await store.runs() if r.run_id == halted.run_id]
    ((run_id, error),) = failures
    assert run_id == halted.run_id and "the model broke" in str(error)
    assert results == [] and pay.paid and summary.status == "error"


async def test_a_new_host_on_the_same_store_resumes_what_an_old_one_kept(tmp_path: Path):
    pay = Pay()
    path = tmp_path / "runs.db"
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store,
            LlmClient.in_process(model, wait_for=Inbox(park_timeout=0.02)) as client,
            host_for(client, pay, store) as host,
        ):
            halted = await host.run("pay")
    assert halted.pending is not None

    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store,
            LlmClient.in_process(model, wait_for=Inbox()) as client,
            host_for(client, pay, store, on_result=results.append) as host,
        ):
            assert await host.requests() == [halted.pending]
            await host.answer(Answer(halted.pending.id, True))
            await until(lambda: bool(results))
    assert results[0].text == "result: paid" and pay.asked == 1


async def test_a_dead_hosts_runs_are_taken_over_once_its_lease_runs_out(tmp_path: Path):
    """A host holds a run parked in memory and stops being heard of (as if SIGKILLed): its
    answer, taken by another host, waits for the lease; then that host goes on with it,
    without asking again, and the tool runs once, with the same idempotency key."""
    path = tmp_path / "runs.db"
    async with SqliteRunStore(path) as store_a, SqliteRunStore(path) as store_b:
        await take_over_a_dead_host(
            store_a, store_b, lease=1.0
        )  # long enough for a loaded machine to renew it in time


async def take_over_a_dead_host(store_a: RunStore, store_b: RunStore, lease: float) -> None:
    """Host A on ``store_a`` parks a run and dies; host B on ``store_b`` (the same journal,
    as another process) takes its answer, then its run once the lease ran out."""
    pay = Pay()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        dead_inbox = Inbox()
        async with (
            LlmClient.in_process(model, wait_for=dead_inbox) as dead_client,
            LlmClient.in_process(model, wait_for=Inbox()) as client,
            host_for(client, pay, store_b, on_result=results.append, lease=lease) as other,
            DurableHost(dead_client, pay.toolkit, store_a, lease=lease) as dead,
            anyio.create_task_group() as doomed,
        ):

            async def doomed_run() -> None:
                # Under load its lease may lapse (and be renewed) before the cancel below:
                # then, woken by the answer, it finds the run taken over at its fence and
                # stops there, as it must (seen once in CI, with the machine loaded).
                with contextlib.suppress(LeaseLostError):
                    await dead.run("pay")

            doomed.start_soon(doomed_run)
            await until(lambda: len(dead_inbox) == 1)
            background = dead._background
            assert background is not None
            background.cancel()  # as if SIGKILLed once parked: nothing renews its leases now
            (request,) = dead_inbox.pending()
            await other.answer(Answer(request.id, True))  # taken: the dead host holds it
            await until(lambda: bool(results))
            doomed.cancel_scope.cancel()
    assert results[0].text == "result: paid"
    assert pay.asked == 1 and len(pay.paid) == 1


async def test_a_worker_that_lost_its_lease_is_stopped_by_its_next_write():
    pay = Pay()
    async with MemoryRunStore() as store, LlmClient.in_process(model) as client:
        async with DurableHost(client, pay.toolkit, store, lease=30) as host:
            begun = await host.begin("pay")
            now = time.time()
            assert await store.claim(begun.run_id, "thief", now + 60, now + 31) is not None
            with pytest.raises(LeaseLostError):
                await begun.run()
            with pytest.raises(UsageError, match="started already"):
                await begun.run()
    assert pay.asked == 0  # stopped before any call ran


async def test_an_expired_stored_request_is_not_listed_refused_and_its_run_goes_on():
    stamp = __import__("datetime").datetime.now(__import__("datetime").UTC) + (
        __import__("datetime").timedelta(seconds=0.3)
    )
    pay = Pay(expires_at=stamp.isoformat())
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            MemoryRunStore() as store,
            LlmClient.in_process(model) as client,
            host_for(client, pay, store, on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None and await host.requests() == [halted.pending]
            await until(lambda: bool(results))  # the sweep finds it expired and goes on
            assert await host.requests() == []
            with pytest.raises(RequestExpiredError):
                await host.answer(Answer(halted.pending.id, True))
    assert results[0].text == "result: declined/expired: pay?"
    assert pay.paid == []


async def test_two_hosts_on_one_store_take_one_answer_and_the_run_follows_it(tmp_path: Path):
    """The run is parked on host A; a decline sent to A and an approval sent to B at the same
    moment: one of them is taken, the other refused, and the run does what was taken."""
    pay = Pay()
    path = tmp_path / "runs.db"
    inbox_a = Inbox()
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store_a,
            SqliteRunStore(path) as store_b,
            LlmClient.in_process(model, wait_for=inbox_a) as client_a,
            LlmClient.in_process(model, wait_for=Inbox()) as client_b,
            host_for(client_a, pay, store_a) as a,
            host_for(client_b, pay, store_b) as b,
            anyio.create_task_group() as tg,
        ):
            done: list[RunResult] = []

            async def drive() -> None:
                done.append(await a.run("pay"))

            tg.start_soon(drive)
            await until(lambda: len(inbox_a) == 1)
            (request,) = inbox_a.pending()
            outcomes: dict[str, str] = {}

            async def send(host: DurableHost, answer: Answer, name: str) -> None:
                try:
                    await host.answer(answer)
                    outcomes[name] = "taken"
                except AlreadyAnsweredError:
                    outcomes[name] = "refused"

            async with anyio.create_task_group() as answers:
                answers.start_soon(send, a, Answer(request.id, False, reason="declined"), "no")
                answers.start_soon(send, b, Answer(request.id, True), "yes")
            await until(lambda: bool(done))
    assert sorted(outcomes.values()) == ["refused", "taken"]
    expected = "result: paid" if outcomes["yes"] == "taken" else "result: declined/expired: pay?"
    assert done[0].text == expected


async def test_running_and_answering_need_the_host_open_and_unknown_ids_are_refused():
    pay = Pay()
    async with MemoryRunStore() as store, LlmClient.in_process(model) as client:
        host = DurableHost(client, pay.toolkit, store)
        async with host:
            halted = await host.run("pay")
            with pytest.raises(UnknownRequestError):
                await host.answer(Answer("req_nobody", True))
            with pytest.raises(UsageError, match="takes an Answer"):
                await host.answer({"id": "r", "ok": True})  # type: ignore[arg-type]
        assert halted.pending is not None
        with pytest.raises(UsageError, match="needs the host open"):
            await host.answer(Answer(halted.pending.id, True))
        assert [r.id for r in await store.requests()] == [halted.pending.id]  # untouched
        with pytest.raises(UsageError, match="not open"):
            await host.run("pay")
        with pytest.raises(UsageError, match="not open"):
            await host.begin("pay")
        with pytest.raises(UsageError, match="not open"):
            host.stream("pay")
    assert pay.paid == []


async def test_a_run_that_raises_is_recorded_as_failed_and_not_resumed():
    pay = Pay()

    def broken(messages: list[Message], tools: list[Any]) -> Any:
        raise RuntimeError("model down")

    async with (
        MemoryRunStore() as store,
        LlmClient.in_process(broken) as client,
        host_for(client, pay, store) as host,
    ):
        with pytest.raises(RuntimeError, match="model down"):
            await host.run("pay")
        (summary,) = await store.runs()
        assert (summary.status, summary.error) == ("error", "RuntimeError: model down")
        assert await store.ready(time.time() + 3600, 10) == []


async def test_a_store_failure_on_answer_is_the_callers_and_takes_nothing():
    pay = Pay()
    failures = [StoreError("database is locked")]

    class Flaky(MemoryRunStore):
        async def accept(
            self,
            answer: Answer,
            now: float,
            *,
            delivered: bool = False,
            by: str | None = None,
            answered_by: str | None = None,
        ) -> Any:
            if failures:
                raise failures.pop()
            return await super().accept(
                answer, now, delivered=delivered, by=by, answered_by=answered_by
            )

    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            Flaky() as store,
            LlmClient.in_process(model) as client,
            host_for(client, pay, store, on_result=results.append) as host,
        ):
            halted = await host.run("pay")
            assert halted.pending is not None
            with pytest.raises(StoreError, match="locked"):
                await host.answer(Answer(halted.pending.id, True))
            await host.answer(Answer(halted.pending.id, True))
            await until(lambda: bool(results))
    assert results[0].text == "result: paid" and len(pay.paid) == 1


async def test_a_halted_run_kept_from_elsewhere_is_resumed_by_the_host():
    pay = Pay()
    results: list[RunResult] = []
    async with MemoryRunStore() as store, LlmClient.in_process(model) as client:
        halted = await client.run("pay", pay.toolkit)  # a plain run: nobody keeps it
        assert await store.requests() == []
        async with host_for(client, pay, store, on_result=results.append) as host:
            await host.keep(halted)
            assert halted.pending is not None
            await host.answer(Answer(halted.pending.id, True))
            with anyio.fail_after(LIMIT):
                await until(lambda: bool(results))
    assert results[0].text == "result: paid"


def test_the_host_checks_its_settings():
    client = LlmClient.in_process(model)
    for setting in ("lease", "sweep", "poll"):
        with pytest.raises(UsageError, match=setting):
            settings: dict[str, Any] = {setting: 0}
            DurableHost(client, Pay().toolkit, MemoryRunStore(), **settings)


async def test_a_wait_for_may_raise_haltrun_to_halt_the_run():
    async def give_up(request: Request) -> Answer:
        raise HaltRun("not now")

    pay = Pay()
    async with LlmClient.in_process(model, wait_for=give_up) as client:
        result = await client.run("pay", pay.toolkit)
    assert result.status == "pending" and result.pending is not None
    assert pay.paid == []


async def test_the_idempotency_key_is_the_same_across_a_halt_and_a_resume():
    """The pay call asks, halts, is resumed in another host: the retry's key is the key
    the call had when it first ran (and another call's key differs)."""
    keys: list[str | None] = []

    @define_tool(name="pay")
    async def pay_tool(ctx: ToolContext | None = None) -> ToolResult:
        """Pay, once approved."""
        assert ctx is not None
        keys.append(ctx.idempotency_key)
        if ctx.answer is None:
            return ToolResult.pending(Request("", "approval", "pay?"))
        return ToolResult.ok("paid")

    def two_calls(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return "ok"
        return reply(tool_call("pay", id="c1"), tool_call("pay", id="c2"))

    results: list[RunResult] = []
    async with (
        MemoryRunStore() as store,
        Toolkit.create(builtins=False, extra_tools=[pay_tool]) as toolkit,
        LlmClient.in_process(two_calls) as client,
        DurableHost(client, toolkit, store, on_result=results.append, sweep=0.02) as host,
    ):
        halted = await host.run("pay twice")
        first, second = [r.request for r in halted.suspended if r.request is not None]
        await host.answer(Answer(first.id, True))
        with anyio.fail_after(LIMIT):
            # Resumed with one answer: the first call goes on, the second waits again.
            await until(lambda: bool(results))
        assert results[0].status == "pending" and results[0].pending == second
        await host.answer(Answer(second.id, True))
        with anyio.fail_after(LIMIT):
            await until(lambda: len(results) == 2)
    assert results[1].text == "ok"
    assert len(keys) == 4 and keys[0] != keys[1]
    assert sorted(keys[2:], key=str) == sorted(keys[:2], key=str)
    assert all(key is not None and key.startswith("tnx-") for key in keys)
