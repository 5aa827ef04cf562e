"""Driving: the runs a durable host drives now, and waiting until none is left."""

from __future__ import annotations

import anyio

from toolnexus_async.durable._driving import Driving

LIMIT = 5


async def test_settle_returns_once_the_last_run_ends() -> None:
    driving = Driving()
    driving.add("a")
    driving.add("b")
    driving.add("a")  # counted once
    assert len(driving) == 2 and "a" in driving
    waiting = anyio.Event()

    async def end_both() -> None:
        await waiting.wait()
        driving.discard("a")
        driving.discard("b")

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(end_both)
            waiting.set()
            assert await driving.settle(patience=LIMIT * 2) == 0
    assert len(driving) == 0 and "a" not in driving


async def test_settle_gives_up_after_patience_with_nothing_ending() -> None:
    driving = Driving()
    assert await driving.settle(patience=0.05) == 0  # nothing driven: at once
    driving.add("stuck")
    with anyio.fail_after(LIMIT):
        assert await driving.settle(patience=0.05) == 1
    driving.discard("stuck")
    driving.discard("never added")  # harmless
    with anyio.fail_after(LIMIT):
        assert await driving.settle(patience=LIMIT * 2) == 0
