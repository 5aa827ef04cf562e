"""What the PostgreSQL group commit must never hold up behind a batch that waits on a lock.

A batch of run writes can wait on a row another worker's transaction holds, a second or
more when PostgreSQL has to find a deadlock first (``deadlock_timeout``). Two things must
not wait with it (issue 41: three workers answering at once paid a run twice):

- a lease renewal: renewed that late, the lease lapses, another worker takes over a run
  whose tool already ran here, and runs it again;
- an answer: answers lock their request first, run writes lock the run first, so the two
  in one transaction could lock each other in a circle with another worker's batch.

Each test holds rows locked from a connection of its own, until both committers of the
run writes wait on it, then checks the write that must not wait commits meanwhile.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg

from tests.pg import next_xid
from tests.test_serve_crash import eventually
from tests.test_store import LEASE, NOW, fresh_state, turn_state
from toolnexus_async import Answer, Request
from toolnexus_async.durable import PostgresRunStore
from toolnexus_async.testing import tool_call

LIMIT = 30.0


async def _waiting(conn: Any) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
    )


async def _until_waiting(conn: Any, count: int) -> None:
    async def enough() -> bool | None:
        return True if await _waiting(conn) >= count else None

    await eventually(f"{count} sessions waiting on a lock", enough)


@asynccontextmanager
async def _two_batches_held(dsn: str, store: PostgresRunStore) -> AsyncIterator[Any]:
    """Two runs' turns, each in a batch of its own, both waiting on their run's row, which a
    transaction of the test holds; released (and the turns committed) on the way out."""
    for run_id in ("run_a", "run_b"):
        await store.start(fresh_state(run_id), "A", NOW + LEASE)
    conn = await asyncpg.connect(dsn)
    try:
        lock = conn.transaction()
        await lock.start()
        await conn.execute(
            "SELECT 1 FROM toolnexus.runs WHERE run_id IN ('run_a', 'run_b') FOR UPDATE"
        )
        async with anyio.create_task_group() as tg:
            watcher = await asyncpg.connect(dsn)
            try:
                for held, run_id in enumerate(("run_a", "run_b"), start=1):
                    tg.start_soon(store.turn, turn_state(run_id, tool_call("pay")), 1, "A")
                    await _until_waiting(watcher, held)  # its batch waits: the next is new
                yield watcher
            finally:
                await watcher.close()
                await lock.rollback()
    finally:
        await conn.close()


async def test_a_lease_renewal_waits_behind_no_batch(pg_dsn: str):
    async with PostgresRunStore(pg_dsn) as store:
        with anyio.fail_after(LIMIT):
            async with _two_batches_held(pg_dsn, store) as watcher:
                with anyio.fail_after(LIMIT / 3):
                    await store.renew("A", NOW + 2 * LEASE)
                alive = await watcher.fetchval(
                    "SELECT alive_until FROM toolnexus.workers WHERE name = 'A'"
                )
                assert alive == NOW + 2 * LEASE
                assert await _waiting(watcher) == 2  # the turns still wait
        assert [(await store.load(r)).turn for r in ("run_a", "run_b")] == [1, 1]


async def test_an_answer_waits_behind_no_run_write(pg_dsn: str):
    async with PostgresRunStore(pg_dsn) as store:
        await store.start(fresh_state("run_c"), "A", NOW + LEASE)
        await store.turn(turn_state("run_c", tool_call("pay", id="c1")), 1, "A")
        await store.suspend("run_c", "c1", Request("req_c", "approval", "pay?"), "A")
        with anyio.fail_after(LIMIT):
            async with _two_batches_held(pg_dsn, store) as watcher:
                with anyio.fail_after(LIMIT / 3):
                    taken = await store.accept(Answer("req_c", True), NOW)
                assert (taken.run_id, taken.call_id) == ("run_c", "c1")
                assert await _waiting(watcher) == 2
        assert (await store.find("req_c")).status == "answered"


async def test_two_answers_to_one_request_in_one_batch_one_is_taken(pg_dsn: str):
    """Grouped, an answer batch locks each request once, in the order of their ids; of two
    answers to one request, the first queued is taken and the second refused."""
    async with PostgresRunStore(pg_dsn) as store:
        for run_id in ("run_1", "run_2"):
            await store.start(fresh_state(run_id), "A", NOW + LEASE)
            await store.turn(turn_state(run_id, tool_call("pay", id="c1")), 1, "A")
            await store.suspend(run_id, "c1", Request(f"req_{run_id}", "approval", "?"), "A")
        outcomes: list[tuple[str, bool, str]] = []

        async def answer(request_id: str, ok: bool) -> None:
            try:
                await store.accept(Answer(request_id, ok), NOW)
                outcomes.append((request_id, ok, "taken"))
            except Exception as exc:
                outcomes.append((request_id, ok, type(exc).__name__))

        before = await next_xid(pg_dsn)
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer, "req_run_2", True)
                tg.start_soon(answer, "req_run_1", False)
                tg.start_soon(answer, "req_run_2", False)
        assert await next_xid(pg_dsn) - before == 1  # one transaction for the three
        assert sorted(outcomes) == [
            ("req_run_1", False, "taken"),
            ("req_run_2", False, "AlreadyAnsweredError"),
            ("req_run_2", True, "taken"),
        ]
        audit = [(r.request_id, r.outcome, r.detail) for r in await store.answers("run_2")]
        assert audit == [
            ("req_run_2", "approved", None),
            ("req_run_2", "refused", "already_answered"),
        ]
