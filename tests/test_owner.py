"""TaskOwner: tasks of an asyncio.TaskGroup held open by one task of an anyio task group.

Ordering is forced with anyio events, never with sleeps.
"""

from __future__ import annotations

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async._core.errors import UsageError
from toolnexus_async._engine.owner import TaskOwner

LIMIT = 5


async def test_leaving_the_group_after_close_waits_for_every_task_even_one_started_late() -> None:
    finished: list[str] = []
    release = anyio.Event()

    async def work(name: str) -> None:
        await release.wait()
        finished.append(name)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            owner = await TaskOwner.open_in(tg, "the test's tasks")
            owner.start_soon(work, "first", name="first")
            owner.close()
            owner.start_soon(work, "late")  # the first still runs: the holder waits for it too
            release.set()
        assert sorted(finished) == ["first", "late"]
        with pytest.raises(UsageError, match="the test's tasks has ended"):
            owner.start_soon(work, "too late")
    assert_no_leaks()


async def test_cancelling_the_anyio_group_cancels_every_task_and_leaves_none() -> None:
    started = 0
    all_started = anyio.Event()
    cancelled: list[int] = []

    async def park(n: int) -> None:
        nonlocal started
        started += 1
        if started == 3:
            all_started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(n)
            raise

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            owner = await TaskOwner.open_in(tg, "parked")
            for n in range(3):
                owner.start_soon(park, n)
            await all_started.wait()
            tg.cancel_scope.cancel()
    assert sorted(cancelled) == [0, 1, 2]
    with pytest.raises(UsageError):
        owner.start_soon(park, 3)
    assert_no_leaks()


async def test_a_task_keeps_its_own_anyio_cancel_scopes() -> None:
    outcome = anyio.Event()
    timed_out: list[bool] = []

    async def bounded() -> None:
        with anyio.move_on_after(0) as scope:
            await anyio.sleep_forever()
        timed_out.append(scope.cancelled_caught)
        outcome.set()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            owner = await TaskOwner.open_in(tg, "bounded")
            owner.start_soon(bounded)
            await outcome.wait()
            owner.close()
    assert timed_out == [True]
    assert_no_leaks()


async def test_a_failing_task_cancels_its_siblings_and_reaches_the_anyio_group() -> None:
    running = anyio.Event()
    cancelled: list[str] = []

    async def sibling() -> None:
        running.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append("sibling")
            raise

    async def fail() -> None:
        await running.wait()
        raise ValueError("boom")

    with anyio.fail_after(LIMIT), pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            owner = await TaskOwner.open_in(tg, "failing")
            owner.start_soon(sibling)
            owner.start_soon(fail)
    assert caught.group_contains(ValueError, match="boom")
    assert cancelled == ["sibling"]
    assert_no_leaks()
