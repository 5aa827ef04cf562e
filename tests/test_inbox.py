"""The Inbox: parking many runs on futures, waking exactly one by answering."""

from __future__ import annotations

import asyncio
import inspect
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.to_thread
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    AnswerError,
    Inbox,
    LlmClient,
    Message,
    Request,
    RequestExpiredError,
    RunResult,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UnknownRequestError,
    UsageError,
    define_tool,
)
from toolnexus_async.durable import DurableHost
from toolnexus_async.testing import ScriptedModel, reply, tool_call


def in_seconds(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def wait_until(predicate: Any) -> None:
    """Yield to the loop until ``predicate()`` holds (bounded by the caller's fail_after)."""
    while not predicate():
        await anyio.lowlevel.checkpoint()


def last_output(messages: list[Message]) -> str:
    """A model that repeats the last tool result."""
    last = messages[-1]
    assert isinstance(last, ToolReturn)
    return last.output


def approval_tool(name: str = "pay", expires: float | None = None) -> Any:
    @define_tool(name=name)
    async def tool(ctx: ToolContext | None = None) -> ToolResult:
        """Needs approval."""
        if ctx is None or ctx.answer is None:
            stamp = in_seconds(expires) if expires is not None else None
            return ToolResult.pending(Request("", "approval", f"{name}?", expires_at=stamp))
        return ToolResult.ok(f"{name} done ({ctx.answer.id})")

    return tool


async def start_runs(
    tg: Any, inbox: Inbox, count: int, results: list[RunResult], **kw: Any
) -> Toolkit:
    toolkit = Toolkit.create(builtins=False, extra_tools=[approval_tool(**kw)])

    async def one(i: int) -> None:
        model = ScriptedModel(reply(tool_call("pay")), last_output)
        async with LlmClient.in_process(model, wait_for=inbox) as client:
            results.append(await client.run(f"run {i}", toolkit))

    for i in range(count):
        tg.start_soon(one, i)
    return toolkit


async def test_parked_requests_are_listed_in_arrival_order_and_answer_wakes_exactly_one():
    """pending() in arrival order; answering one id finishes that run and no other."""
    inbox = Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await start_runs(tg, inbox, 3, results)
            await wait_until(lambda: len(inbox) == 3)
            parked = inbox.pending()
            assert [r.prompt for r in parked] == ["pay?"] * 3
            await inbox.answer(Answer(parked[1].id, True))
            await wait_until(lambda: len(results) == 1)
            assert results[0].text == f"pay done ({parked[1].id})"
            assert [r.id for r in inbox.pending()] == [parked[0].id, parked[2].id]
            for request in inbox.pending():
                await inbox.answer(Answer(request.id, True))
    assert len(results) == 3 and len(inbox) == 0
    assert_no_leaks()


async def test_wrong_answers_raise_their_own_error_and_change_nothing():
    """Unknown, already answered and expired ids each raise a distinct AnswerError."""
    inbox = Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await start_runs(tg, inbox, 2, results)
            await wait_until(lambda: len(inbox) == 2)
            first, second = inbox.pending()
            with pytest.raises(UnknownRequestError):
                await inbox.answer(Answer("nobody", True))
            assert len(inbox) == 2
            await inbox.answer(Answer(first.id, True))
            with pytest.raises(AlreadyAnsweredError) as caught:
                await inbox.answer(Answer(first.id, False, reason="declined"))
            assert caught.value.request_id == first.id
            assert [r.id for r in inbox.pending()] == [second.id]
            await inbox.answer(Answer(second.id, True))
    assert sorted(r.text for r in results) == sorted(
        [f"pay done ({first.id})", f"pay done ({second.id})"]
    )
    for cls in (UnknownRequestError, AlreadyAnsweredError, RequestExpiredError):
        assert issubclass(cls, AnswerError) and issubclass(cls, LookupError)


async def test_expires_at_wakes_the_parked_run_as_expired():
    """A parked request whose expires_at passes is answered expired at that moment."""
    inbox = Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await start_runs(tg, inbox, 1, results, expires=0.05)
            await wait_until(lambda: len(inbox) == 1)
            request = inbox.pending()[0]
            await wait_until(lambda: len(results) == 1)
    assert results[0].text == "declined/expired: pay?"
    assert len(inbox) == 0
    with pytest.raises(RequestExpiredError):
        await inbox.answer(Answer(request.id, True))


async def test_expiry_uses_one_timer_not_a_task_per_request():
    """Many parked requests with deadlines add no task; the earliest deadline fires first."""
    inbox = Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await start_runs(tg, inbox, 20, results, expires=30)
            await start_runs(tg, inbox, 1, results, expires=0.05)
            await wait_until(lambda: len(inbox) == 21)
            tasks_parked = len(anyio.get_running_tasks())
            assert len(inbox._timers) == 21
            assert inbox._timers._timer is not None
            await wait_until(lambda: len(results) == 1)
            assert results[0].text == "declined/expired: pay?"
            assert len(anyio.get_running_tasks()) == tasks_parked - 1
            for request in inbox.pending():
                await inbox.answer(Answer(request.id, True))
    assert len(results) == 21


async def test_cancelling_a_parked_run_removes_its_entry():
    """A run cancelled while parked leaves the inbox; its id is then unknown."""
    inbox = Inbox()
    toolkit = Toolkit.create(builtins=False, extra_tools=[approval_tool()])
    model = ScriptedModel(reply(tool_call("pay")), "unreachable")
    with anyio.fail_after(5):
        async with LlmClient.in_process(model, wait_for=inbox) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.run, "go", toolkit)
                await wait_until(lambda: len(inbox) == 1)
                request = inbox.pending()[0]
                tg.cancel_scope.cancel()
    assert len(inbox) == 0
    with pytest.raises(UnknownRequestError):
        await inbox.answer(Answer(request.id, True))
    assert_no_leaks()


async def test_a_cancelled_wait_leaves_the_inbox_in_the_same_step():
    """Cancelling a parked wait removes its entry at once, not an iteration later (the
    slot is the future the run awaits, and its cancel() does the cleanup)."""
    inbox = Inbox()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(inbox, Request("r-1", "approval", "?", expires_at=in_seconds(60)))
            await wait_until(lambda: len(inbox) == 1)
            tg.cancel_scope.cancel()
            assert len(inbox) == 0 and inbox.get("r-1") is None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(inbox(Request("r-2", "approval", "?")), 0.01)
    assert len(inbox) == 0
    with pytest.raises(UnknownRequestError):
        await inbox.answer(Answer("r-2", True))


async def test_a_subclass_is_told_each_request_that_leaves_before_its_run_wakes():
    """``Inbox._left`` (serve books requests with it): once per request that leaves with an
    answer, an expiry or a cancelled wait, before the run wakes; never for a halt."""

    class Booking(Inbox):
        def __init__(self) -> None:
            super().__init__(park_timeout=60)
            self.left: list[tuple[str, str]] = []

        def _left(self, slot: Any, answer: Answer | None) -> None:
            assert answer is None or not slot.done()  # told before the run is woken
            outcome = "cancelled" if answer is None else (answer.reason or "answered")
            self.left.append((slot.request.id, outcome))

    inbox = Booking()
    outcomes: dict[str, str] = {}

    async def park(request: Request) -> None:
        try:
            answer = await inbox(request)
        except Exception as exc:
            outcomes[request.id] = type(exc).__name__
        else:
            outcomes[request.id] = answer.reason or "ok"

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for name in ("answered", "halted"):
                tg.start_soon(park, Request(name, "approval", "?"))
            cancelled = asyncio.create_task(inbox(Request("cancelled", "approval", "?")))
            tg.start_soon(park, Request("expired", "approval", "?", expires_at=in_seconds(0.05)))
            await wait_until(lambda: len(inbox) == 4)
            await inbox.answer(Answer("answered", True))
            await wait_until(lambda: "expired" in outcomes)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            inbox.halt_all()
    assert inbox.left == [
        ("answered", "answered"),
        ("expired", "expired"),
        ("cancelled", "cancelled"),
    ]
    assert outcomes == {"answered": "ok", "expired": "expired", "halted": "HaltRun"}
    assert_no_leaks()


async def test_cancelled_and_answered_parks_leave_no_timer_entry_behind():
    """Entries of requests that left (cancelled, answered) do not pile up in the timer heap.

    100,000 cancelled parks once kept their entries until each deadline (~25 MiB): the heap
    now holds at most twice the live entries, and none when nothing with a deadline waits.
    """
    inbox = Inbox(park_timeout=3600)
    results: list[RunResult] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async with anyio.create_task_group() as doomed:
                await start_runs(doomed, inbox, 50, results, expires=3600)
                await wait_until(lambda: len(inbox) == 50)
                assert len(inbox._timers) == 100  # an expiry and a spill entry each
                doomed.cancel_scope.cancel()
            assert len(inbox) == 0
            assert len(inbox._timers) == 0 and inbox._timers._timer is None

            await start_runs(tg, inbox, 40, results, expires=3600)
            await wait_until(lambda: len(inbox) == 40)
            for request in inbox.pending()[:30]:
                await inbox.answer(Answer(request.id, True))
            await wait_until(lambda: len(results) == 30)
            live = 2 * len(inbox)
            assert live <= len(inbox._timers) <= 2 * live
            for request in inbox.pending():
                await inbox.answer(Answer(request.id, True))
    assert len(inbox._timers) == 0 and inbox._timers._timer is None
    assert len(results) == 40
    assert_no_leaks()


async def test_a_time_limit_on_a_parked_run_removes_its_entry():
    """move_on_after around a run parked in the inbox cleans up as well."""
    inbox = Inbox()
    toolkit = Toolkit.create(builtins=False, extra_tools=[approval_tool()])
    async with LlmClient.in_process(ScriptedModel(reply(tool_call("pay"))), wait_for=inbox) as c:
        with anyio.move_on_after(0.05) as scope:
            await c.run("go", toolkit)
    assert scope.cancelled_caught
    assert len(inbox) == 0
    assert_no_leaks()


async def test_requests_yields_each_new_request_once_to_every_listener():
    """Two listeners each see every newly parked request exactly once, in order."""
    inbox = Inbox()
    results: list[RunResult] = []
    seen: dict[str, list[str]] = {"a": [], "b": []}

    async def listen(name: str, count: int) -> None:
        async for request in inbox.requests():
            seen[name].append(request.id)
            if len(seen[name]) == count:
                return

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(listen, "a", 3)
            tg.start_soon(listen, "b", 3)
            await wait_until(lambda: len(inbox._listeners.listening) == 2)
            await start_runs(tg, inbox, 3, results)
            await wait_until(lambda: len(seen["a"]) == 3 and len(seen["b"]) == 3)
            assert seen["a"] == seen["b"] == [r.id for r in inbox.pending()]
            for request in inbox.pending():
                await inbox.answer(Answer(request.id, True))
    assert len(results) == 3
    assert inbox._listeners.listening == set()


async def test_requests_hands_on_a_burst_of_parks_in_one_step():
    """Requests parked together reach a listener in one step of the loop, not one step
    each: forwarding a burst of parks costs the listener one trip through the loop."""
    inbox = Inbox()
    steps = 0  # steps of the loop so far, counted by a task that yields at each
    seen: list[tuple[str, int]] = []

    async def count_steps() -> None:
        nonlocal steps
        while True:
            steps += 1
            await anyio.lowlevel.checkpoint()

    async def listen() -> None:
        async for request in inbox.requests():
            seen.append((request.id, steps))
            if len(seen) == 5:
                return

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(count_steps)
            tg.start_soon(listen)
            await wait_until(lambda: len(inbox._listeners.listening) == 1)
            for n in range(5):
                tg.start_soon(inbox, Request(f"r-{n}", "approval", "?"))
            await wait_until(lambda: len(seen) == 5)
            assert [request_id for request_id, _ in seen] == [f"r-{n}" for n in range(5)]
            assert len({at for _, at in seen}) == 1, seen
            tg.cancel_scope.cancel()
    assert len(inbox) == 0
    assert inbox._listeners.listening == set()
    assert_no_leaks()


async def test_answer_threadsafe_from_another_thread():
    """A thread answers through answer_threadsafe; errors come back to that thread."""
    inbox = Inbox()
    results: list[RunResult] = []
    errors: list[BaseException] = []

    def from_thread(request_id: str) -> None:
        inbox.answer_threadsafe(Answer(request_id, True), timeout=5)
        try:
            inbox.answer_threadsafe(Answer(request_id, True), timeout=5)
        except AlreadyAnsweredError as exc:
            errors.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await start_runs(tg, inbox, 1, results)
            await wait_until(lambda: len(inbox) == 1)
            request_id = inbox.pending()[0].id
            thread = threading.Thread(target=from_thread, args=(request_id,))
            thread.start()
            await anyio.to_thread.run_sync(thread.join)
    assert results[0].text == f"pay done ({request_id})"
    assert len(errors) == 1
    with pytest.raises(UsageError, match="deadlock"):
        inbox.answer_threadsafe(Answer(request_id, True))


def test_answer_threadsafe_before_any_park_is_a_usage_error():
    """An inbox that never parked has no loop to hand the answer to."""
    with pytest.raises(UsageError, match="no run has parked"):
        Inbox().answer_threadsafe(Answer("x", True))


async def test_an_already_expired_request_is_answered_without_parking():
    """Called directly with a passed expires_at, the inbox answers expired at once."""
    inbox = Inbox()
    answer = await inbox(Request("r1", "approval", "?", expires_at="2000-01-01T00:00:00Z"))
    assert answer == Answer("r1", False, reason="expired")
    assert len(inbox) == 0
    with pytest.raises(RequestExpiredError):
        await inbox.answer(Answer("r1", True))


async def test_a_duplicate_request_id_is_refused():
    """Two parks with one id would make answers ambiguous."""
    inbox = Inbox()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(inbox, Request("same", "approval", "?"))
            await wait_until(lambda: len(inbox) == 1)
            with pytest.raises(UsageError, match="already parked"):
                await inbox(Request("same", "approval", "?"))
            await inbox.answer(Answer("same", True))


async def test_remember_bounds_the_memory_of_finished_ids():
    """Past `remember` finished ids, the oldest is forgotten and becomes unknown."""
    inbox = Inbox(remember=2)
    for name in ("a", "b", "c"):
        await inbox(Request(name, "approval", "?", expires_at="2000-01-01T00:00:00Z"))
    with pytest.raises(UnknownRequestError):
        await inbox.answer(Answer("a", True))
    with pytest.raises(RequestExpiredError):
        await inbox.answer(Answer("c", True))


def test_a_dict_instead_of_an_answer_says_how_to_build_one():
    inbox = Inbox()
    with pytest.raises(UsageError, match=r"takes an Answer, got dict: .*Answer.from_dict"):
        inbox.answer_nowait({"id": "r1", "ok": True})  # type: ignore[arg-type]


async def test_answer_is_awaited_like_a_hosts_and_answer_nowait_serves_callbacks():
    """``await inbox.answer(...)`` as ``await host.answer(...)``; ``answer_nowait`` does the
    same from a callback on the loop, raising what ``answer`` raises."""
    assert inspect.iscoroutinefunction(Inbox.answer)
    assert inspect.iscoroutinefunction(DurableHost.answer)
    inbox = Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await start_runs(tg, inbox, 2, results)
            await wait_until(lambda: len(inbox) == 2)
            first, second = inbox.pending()
            woken = asyncio.get_running_loop().create_future()

            def on_click() -> None:  # a callback: it cannot await
                inbox.answer_nowait(Answer(first.id, True))
                woken.set_result(None)

            asyncio.get_running_loop().call_soon(on_click)
            await woken
            with pytest.raises(AlreadyAnsweredError):
                inbox.answer_nowait(Answer(first.id, True))
            await inbox.answer(Answer(second.id, True))
    assert sorted(r.text for r in results) == sorted(
        [f"pay done ({first.id})", f"pay done ({second.id})"]
    )
