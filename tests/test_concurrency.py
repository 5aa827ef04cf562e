"""run_concurrently: jobs that never wait need no task; jobs that wait run concurrently.

Ordering is forced with anyio events, never with sleeps.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from tests.shared import Holding
from toolnexus_async._engine.concurrency import run_all, run_concurrently

LIMIT = 5

Job = Callable[[], Coroutine[Any, Any, str]]


def job(fn: Callable[..., Coroutine[Any, Any, str]], *args: Any) -> Job:
    return functools.partial(fn, *args)


def start(job: Job) -> Coroutine[Any, Any, str]:
    return job()


async def together(jobs: list[Job]) -> list[str]:
    """As the engine runs a turn: the last job is the caller's when the others finished."""
    results = run_concurrently(start, jobs)
    if isinstance(results, tuple):
        return [*results, await start(jobs[-1])]
    return await results


async def test_jobs_that_never_wait_run_in_the_calling_task_in_order() -> None:
    caller = asyncio.current_task()
    seen: list[tuple[str, bool]] = []

    async def quick(name: str) -> str:
        seen.append((name, asyncio.current_task() is caller))
        return name.upper()

    results = await together([job(quick, "a"), job(quick, "b"), job(quick, "c")])
    assert results == ["A", "B", "C"]
    assert seen == [("a", True), ("b", True), ("c", True)]
    assert asyncio.all_tasks() == {caller}


async def test_when_no_job_waits_the_results_come_back_as_a_tuple_with_nothing_to_await() -> None:
    async def quick(name: str) -> str:
        return name.upper()

    results = run_concurrently(start, [job(quick, "a"), job(quick, "b")])
    # The last job is left to the caller, who awaits it in its own frame.
    assert type(results) is tuple and results == ("A",)
    # A lone job: the empty tuple, no list for a parked run to hold.
    lone = run_concurrently(start, [job(quick, "a")])
    assert type(lone) is tuple and lone == ()


async def test_run_all_awaits_the_last_job_too() -> None:
    go = anyio.Event()

    async def quick(name: str) -> str:
        return name.upper()

    async def waits(name: str) -> str:
        await go.wait()
        return name.upper()

    async def releases(name: str) -> str:
        go.set()
        return name.upper()

    with anyio.fail_after(LIMIT):
        assert await run_all(start, [job(quick, "a"), job(quick, "b")]) == ["A", "B"]
        assert await run_all(start, [job(quick, "a")]) == ["A"]
        both = await run_all(start, [job(waits, "w"), job(releases, "r")])
    assert both == ["W", "R"]
    assert_no_leaks()


async def test_the_first_job_that_waits_stays_in_the_caller_and_later_ones_get_tasks() -> None:
    caller = asyncio.current_task()
    tasks: dict[str, asyncio.Task[Any] | None] = {}
    go = anyio.Event()

    async def quick(name: str) -> str:
        tasks[name] = asyncio.current_task()
        return name

    async def waits(name: str) -> str:
        tasks[name] = asyncio.current_task()
        await go.wait()
        return name

    async def releases(name: str) -> str:
        tasks[name] = asyncio.current_task()
        go.set()
        return name

    with anyio.fail_after(LIMIT):
        results = await together(
            [job(quick, "q"), job(waits, "w"), job(releases, "r"), job(quick, "q2")]
        )
    assert results == ["q", "w", "r", "q2"]
    assert tasks["q"] is caller and tasks["w"] is caller
    assert tasks["r"] is not caller and tasks["q2"] is not caller
    assert tasks["r"] is not tasks["q2"]
    assert_no_leaks()


async def test_waiting_jobs_run_concurrently_and_results_keep_job_order() -> None:
    # Each job waits for the next one to finish: run one after the other, this deadlocks.
    finished = [anyio.Event() for _ in range(3)]
    finish_order: list[int] = []

    async def chained(index: int) -> str:
        if index + 1 < len(finished):
            await finished[index + 1].wait()
        finish_order.append(index)
        finished[index].set()
        return f"job {index}"

    with anyio.fail_after(LIMIT):
        results = await together([job(chained, i) for i in range(3)])
    assert results == ["job 0", "job 1", "job 2"]
    assert finish_order == [2, 1, 0]
    assert_no_leaks()


async def test_a_job_that_only_yields_to_the_loop_goes_on_where_it_left_off() -> None:
    """A bare yield (asyncio.sleep(0)) is passed through, and the job resumes after it."""
    steps: list[str] = []

    async def yields(name: str) -> str:
        for step in range(3):
            steps.append(f"{name}{step}")
            await asyncio.sleep(0)
        return name

    with anyio.fail_after(LIMIT):
        results = await together([job(yields, "a"), job(yields, "b")])
    assert results == ["a", "b"]
    assert sorted(steps) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert steps.index("b0") < steps.index("a2")  # they took turns: concurrent, not serial
    assert_no_leaks()


async def test_each_job_has_its_own_copy_of_the_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")
    seen: list[str] = []
    go = anyio.Event()

    async def sets(name: str) -> str:
        seen.append(var.get())
        var.set(name)
        await go.wait()  # goes on in the caller's task, still in its own context
        return var.get()

    async def also_sets(name: str) -> str:
        seen.append(var.get())
        var.set(name)
        go.set()
        return var.get()

    with anyio.fail_after(LIMIT):
        results = await together([job(also_sets, "a"), job(sets, "b"), job(also_sets, "c")])
    assert results == ["a", "b", "c"]
    assert seen == ["caller", "caller", "caller"]
    assert var.get() == "caller"


async def test_a_last_job_left_to_the_caller_runs_in_the_callers_context() -> None:
    # As a lone job awaited by the caller does: no copy of the context is made for it.
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")

    async def sets(name: str) -> str:
        var.set(name)
        return name

    with anyio.fail_after(LIMIT):
        results = await together([job(sets, "a"), job(sets, "b")])
    assert results == ["a", "b"]
    assert var.get() == "b"


async def test_a_cancel_scope_inside_a_job_that_waits_works_across_the_hand_over() -> None:
    # The scope is entered during the job's first step and cancelled by a sibling task:
    # the cancellation must reach the job, in the task the scope belongs to.
    scopes: list[anyio.CancelScope] = []
    entered = anyio.Event()

    async def guarded() -> str:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            entered.set()
            await anyio.sleep_forever()
        return "cancelled" if scope.cancelled_caught else "not cancelled"

    async def canceller() -> str:
        await entered.wait()
        scopes[0].cancel()
        return "cancelled it"

    with anyio.fail_after(LIMIT):
        results = await together([job(guarded), job(canceller)])
    assert results == ["cancelled", "cancelled it"]
    assert_no_leaks()


async def test_a_job_that_fails_after_waiting_cancels_the_others() -> None:
    go = anyio.Event()
    cancelled: list[str] = []

    async def fails() -> str:
        await go.wait()
        raise ValueError("broken tool")

    async def forever(name: str) -> str:
        go.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(name)
        return name

    with anyio.fail_after(LIMIT), pytest.raises(ExceptionGroup) as caught:
        await together([job(fails), job(forever, "x"), job(forever, "y")])
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
    assert sorted(cancelled) == ["x", "y"]
    assert_no_leaks()


async def test_a_job_that_fails_before_waiting_raises_as_is_and_later_jobs_never_start() -> None:
    started: list[str] = []

    async def fails() -> str:
        raise ValueError("broken at once")

    async def later() -> str:
        started.append("later")
        return "later"

    with pytest.raises(ValueError, match="broken at once"):
        await together([job(fails), job(later)])
    assert started == []


async def test_cancelling_the_caller_cancels_every_job_and_leaves_nothing() -> None:
    waiting = Holding(3)

    async def forever(name: str) -> str:
        await waiting.hold(name)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(together, [job(forever, str(i)) for i in range(3)])
            await waiting.all_here.wait()
            tg.cancel_scope.cancel()
    assert sorted(waiting.cancelled) == ["0", "1", "2"]
    assert_no_leaks()


async def test_closing_an_unfinished_run_closes_the_job_it_carries() -> None:
    finished: list[str] = []
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def waits() -> str:
        try:
            await future
        finally:
            finished.append("closed")
        return "never"

    async def quick() -> str:
        return "quick"

    outer = together([job(quick), job(waits)])
    assert outer.send(None) is future  # the job's future reaches whoever drives the run
    outer.close()
    assert finished == ["closed"]
    future.cancel()
