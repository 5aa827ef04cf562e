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

And no two transactions may lock requests in two orders (``_order``): a batch of answers
locks its requests in id order, and a batch of run writes that closes requests or marks
answers delivered locked them in whatever order its statements met them. The cycle tests
build the circle that deadlocked, step by step: a connection of the test holds a row the
run batch needs between two requests, the answer batch takes the first request and waits
for the second, then the row is let go. PostgreSQL must then find no deadlock: both
batches commit, once each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg

from tests.pg import PgServer, next_xid
from tests.test_serve_crash import eventually
from tests.test_store import LEASE, NOW, fresh_state, turn_state
from toolnexus_async import AlreadyAnsweredError, Answer, AnswerError, Request, RunResult
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


async def _answered_elsewhere(store: PostgresRunStore, runs: Mapping[str, tuple[str, ...]]) -> None:
    """Each run (run id: request ids, one a call of its first turn) held by worker A, its
    requests answered by worker B and not yet handed over to A (what a run's next turn or
    end closes)."""
    for run_id, request_ids in runs.items():
        await store.start(fresh_state(run_id), "A", NOW + LEASE)
        calls = [tool_call("pay", id=f"c{n}") for n in range(len(request_ids))]
        await store.turn(turn_state(run_id, *calls), 1, "A")
        for call, request_id in zip(calls, request_ids, strict=True):
            await store.suspend(run_id, call.id, Request(request_id, "approval", "pay?"), "A")
            await store.accept(Answer(request_id, True), NOW, by="B")


async def _deadlocks(dsn: str) -> int:
    """What PostgreSQL counted for the database, once the store's sessions have gone (a
    session hands its counts over when it ends, not when a deadlock happens)."""
    conn = await asyncpg.connect(dsn)
    try:

        async def alone() -> bool | None:
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            return True if others == 0 else None

        await eventually("the store's sessions gone", alone)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(
            await conn.fetchval(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            )
        )
    finally:
        await conn.close()


@asynccontextmanager
async def _no_deadlock(server: PgServer, dsn: str) -> AsyncIterator[None]:
    """Checks, once the block (its store closed) is over, that PostgreSQL found no
    deadlock meanwhile: none logged, none counted."""
    log_start = server.log_file.stat().st_size
    before = await _deadlocks(dsn)
    yield
    logged = server.log_file.read_bytes()[log_start:].decode(errors="replace")
    assert "deadlock detected" not in logged
    assert await _deadlocks(dsn) == before


async def _two_orders(
    server: PgServer,
    dsn: str,
    held: str,
    run_batch: Callable[[PostgresRunStore], list[Callable[[], Coroutine[Any, Any, Any]]]],
    runs: Mapping[str, tuple[str, ...]] | None = None,
) -> None:
    """The circle, step by step: the test locks ``held``; the writes of ``run_batch``, one
    batch, lock a request and wait on it; late duplicate answers to req_a and req_b, one
    batch, wait too; then ``held`` is let go. No deadlock: both batches commit, once each."""
    async with _no_deadlock(server, dsn), PostgresRunStore(dsn) as store:
        three = {"run_1": ("req_b",), "run_2": ("req_c",), "run_3": ("req_a",)}
        await _answered_elsewhere(store, three if runs is None else runs)
        refused: list[str] = []

        async def late(request_id: str) -> None:
            try:
                await store.accept(Answer(request_id, False), NOW, by="C")
            except AlreadyAnsweredError:
                refused.append(request_id)

        conn = await asyncpg.connect(dsn)
        watcher = await asyncpg.connect(dsn)
        try:
            with anyio.fail_after(LIMIT):
                first_xid = await next_xid(dsn)
                lock = conn.transaction()
                await lock.start()
                await conn.execute(held)
                async with anyio.create_task_group() as tg:
                    for write in run_batch(store):  # queued together: one batch
                        tg.start_soon(write)
                    await _until_waiting(watcher, 1)
                    tg.start_soon(late, "req_a")
                    tg.start_soon(late, "req_b")
                    await _until_waiting(watcher, 2)
                    await lock.rollback()
                transactions = await next_xid(dsn) - first_xid
        finally:
            await watcher.close()
            await conn.close()
        assert sorted(refused) == ["req_a", "req_b"]
        undelivered = {answer.id for _, answer in await store.deliveries("A")}
        assert not undelivered & {"req_a", "req_b"}
    assert transactions == 3  # the test's lock, the run batch, the answers: none went again


async def test_a_run_batch_closing_requests_and_an_answer_batch_lock_in_one_order(
    pg_server: PgServer, pg_dsn: str
):
    """A turn closes run_1's req_b, then an end (run_3's, held back by the test's lock on
    its run) would close req_a, while duplicate answers hold req_a and wait for req_b."""

    def writes(store: PostgresRunStore) -> list[Callable[[], Coroutine[Any, Any, Any]]]:
        call = tool_call("pay", id="c1")
        end = RunResult("done", "paid", turn_state("run_3", call).messages, run_id="run_3")
        return [
            lambda: store.turn(turn_state("run_1", tool_call("pay", id="c2")), 2, "A"),
            lambda: store.finish(end, "A"),
        ]

    await _two_orders(
        pg_server, pg_dsn, "SELECT 1 FROM toolnexus.runs WHERE run_id = 'run_3' FOR UPDATE", writes
    )
    async with PostgresRunStore(pg_dsn) as store:
        assert ((await store.load("run_1")).turn, (await store.load("run_3")).status) == (
            2,
            "done",
        )


async def test_a_lone_end_closes_its_requests_in_the_answers_order(
    pg_server: PgServer, pg_dsn: str
):
    """An end alone in its batch (no lock taken before it) closed its run's requests as
    its plan met them, req_b, req_c, req_a; the test holds req_c."""

    def writes(store: PostgresRunStore) -> list[Callable[[], Coroutine[Any, Any, Any]]]:
        return [lambda: store.finish(RunResult("done", "paid", (), run_id="run_1"), "A")]

    await _two_orders(
        pg_server,
        pg_dsn,
        "SELECT 1 FROM toolnexus.requests WHERE request_id = 'req_c' FOR UPDATE",
        writes,
        {"run_1": ("req_b", "req_c", "req_a")},
    )


async def test_answers_marked_delivered_are_locked_in_the_answers_order(
    pg_server: PgServer, pg_dsn: str
):
    """``delivered`` met req_b, req_c, req_a (its plan walks the undelivered by run);
    the test holds req_c, so it holds req_b and waits while the answers take req_a."""

    def writes(store: PostgresRunStore) -> list[Callable[[], Coroutine[Any, Any, Any]]]:
        return [lambda: store.delivered(["req_a", "req_b", "req_c"])]

    await _two_orders(
        pg_server,
        pg_dsn,
        "SELECT 1 FROM toolnexus.requests WHERE request_id = 'req_c' FOR UPDATE",
        writes,
    )


async def test_pruning_waits_for_no_request_and_leaves_a_run_held_elsewhere(
    pg_server: PgServer, pg_dsn: str
):
    """Pruning, last in a batch, deleted the ended runs' requests in the order it met them
    (req_b, req_c, req_a) while duplicate answers locked req_a, then req_b. It now takes
    them without waiting: a run whose request is locked elsewhere stays until the next."""
    runs = {"run_1": ("req_b",), "run_2": ("req_c",), "run_3": ("req_a",)}
    async with _no_deadlock(pg_server, pg_dsn):
        async with PostgresRunStore(pg_dsn) as store:
            await _answered_elsewhere(store, runs)
            for run_id in runs:
                await store.finish(RunResult("done", "paid", (), run_id=run_id), "A")
        conn = await asyncpg.connect(pg_dsn)
        watcher = await asyncpg.connect(pg_dsn)
        done: list[str] = []

        async def write(what: str, call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
            try:
                await call()
            except AnswerError:  # a late answer: refused, or its request pruned
                pass
            done.append(what)

        async def until(waiting: int, finished: int) -> None:
            async def either() -> bool | None:
                return True if len(done) >= finished or await _waiting(watcher) >= waiting else None

            await eventually(f"{waiting} waiting or {finished} done", either)

        try:
            async with (
                PostgresRunStore(pg_dsn) as answers,
                PostgresRunStore(pg_dsn, keep_finished=0, prune_every=0) as pruning,
            ):
                with anyio.fail_after(LIMIT):
                    lock = conn.transaction()
                    await lock.start()
                    await conn.execute(
                        "SELECT 1 FROM toolnexus.requests WHERE request_id = 'req_c' FOR UPDATE"
                    )
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(write, "prune", lambda: pruning.release("run_9", "A"))
                        await until(1, 1)
                        for request_id in ("req_a", "req_b"):
                            late = Answer(request_id, False)
                            tg.start_soon(write, request_id, lambda a=late: answers.accept(a, NOW))
                        await until(2, 3)
                        await lock.rollback()
                assert [r.run_id for r in await pruning.runs()] == ["run_2"]
                await pruning.release("run_9", "A")  # the next pruning
                assert await pruning.runs() == []
        finally:
            await watcher.close()
            await conn.close()
