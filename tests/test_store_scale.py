"""What many parked runs cost a SqliteRunStore's host: work that grows with what it finds,
not with what is parked, and a loop that is never filled by one commit's callers.

A host asks its store twice a second for answers to hand over (``deliveries``) and once a
second for runs that can go on (``ready``). With every run of the worker parked, both must
be driven by the few undelivered requests, not by a walk over the worker's runs: the
plans are read from SQLite itself (``EXPLAIN QUERY PLAN`` of the statements the queries
actually ran, caught by a trace callback). The callers of one group commit are resumed a
slice per loop iteration (counted by a task that ticks once per iteration). No timing is
involved.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio

from toolnexus_async import Answer, AssistantMessage, Request, ToolCall
from toolnexus_async._core.loop import RunLoop
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.durable.sqlite import _queries as queries

WORKER = "w1"
RUNS = 60


async def parked_store(path: Path) -> None:
    """RUNS runs held by WORKER, each parked on one request; one of them answered."""
    async with SqliteRunStore(path) as store:
        for n in range(RUNS):
            loop = RunLoop(f"go {n}", run_id=f"run_{n}", style="in-process")
            call = ToolCall(f"c{n}", "pay", {})
            loop.messages.append(AssistantMessage(None, (call,)))
            await store.start(loop.snapshot(), WORKER, time.time() + 60, turn=1)
            await store.suspend(f"run_{n}", call.id, Request(f"req-{n}", "approval", "ok?"), WORKER)
        await store.accept(Answer("req-7", True), time.time())


def plans_of(path: Path, query: Callable[[sqlite3.Connection], Any]) -> tuple[Any, list[str]]:
    """What ``query`` returned, and the plan steps of every statement it ran."""
    ran: list[str] = []
    with closing(sqlite3.connect(path)) as conn:
        conn.set_trace_callback(ran.append)
        found = query(conn)
        conn.set_trace_callback(None)
        steps = [
            row[3] for sql in ran for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
        ]
    return found, steps


def walks_the_runs(steps: list[str]) -> list[str]:
    """The steps that walk every run or every request (a table scan, or requests looked
    up run by run): a cost that grows with what is parked."""
    scans = {"SCAN r", "SCAN runs", "SCAN q", "SCAN requests"}
    return [s for s in steps if s in scans or "requests_by_run" in s]


async def test_handing_over_answers_is_driven_by_the_undelivered_requests(tmp_path):
    path = tmp_path / "runs.db"
    await parked_store(path)
    found, steps = plans_of(path, lambda conn: queries.deliveries(conn, WORKER))
    # Accepted without being handed over: the one answer the worker is to be given.
    assert [(run_id, answer.id) for run_id, answer in found] == [("run_7", "req-7")]
    assert any("requests_undelivered" in s for s in steps), steps
    assert walks_the_runs(steps) == [], steps
    # Nor by the runs the worker holds: here, every one of them.
    assert not any("runs_held" in s for s in steps), steps


async def test_the_sweep_is_driven_by_small_indexes_only(tmp_path):
    path = tmp_path / "runs.db"
    await parked_store(path)
    # Every run is held by a live worker and none halted: nothing can go on.
    found, steps = plans_of(path, lambda conn: queries.ready(conn, time.time(), 100))
    assert found == []
    assert any("requests_undelivered" in s for s in steps), steps
    assert walks_the_runs(steps) == [], steps


async def test_a_large_batch_tells_its_writers_a_slice_per_loop_turn(tmp_path):
    """Group commit puts many writes in one transaction; their callers are then resumed a
    slice at a time, each loop turn, so the steps they take next never fill one turn."""
    turns = 0
    resumed_at: dict[int, int] = {}

    async def ticker() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    async def write(store: SqliteRunStore, n: int) -> None:
        loop = RunLoop(f"go {n}", run_id=f"run_{n}", style="in-process")
        await store.start(loop.snapshot(), WORKER, time.time() + 60)
        resumed_at[n] = turns

    async with SqliteRunStore(tmp_path / "runs.db") as store:
        tick = asyncio.get_running_loop().create_task(ticker())
        async with anyio.create_task_group() as tg:
            for n in range(300):
                tg.start_soon(write, store, n)
        tick.cancel()
        assert await store.runs(limit=1000) and len(await store.runs(limit=1000)) == 300
    # The first writer commits alone; the 299 queued behind it share the next commit.
    later = sorted(resumed_at[n] for n in range(1, 300))
    assert len(set(later)) >= 299 // 64, later
    assert later[-1] - later[0] >= 299 // 64
