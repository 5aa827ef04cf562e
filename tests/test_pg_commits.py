"""How many write transactions a durable run costs on PostgreSQL (issue 41).

Counted by the server, not by the store: the transaction ids assigned on the cluster while
the runs go (``pg_snapshot_xmax`` before and after). Every transaction that writes a row
or sends a NOTIFY gets one; reads get none. The runs are the ``serve`` path: ``begin``
(kept before it is acknowledged), the model asks for the tool, the tool asks for
approval, the answer is taken on the same worker, the tool runs, the run ends.

A run alone cannot share a transaction with another run: its count is its own writes
(start, turn, suspension, answer, the tool's result, the end). Runs that go together share
their transactions (group commit), as ``serve`` under load does. (A run whose
``require_approval`` gate asks, rather than its tool, writes its turn with the request:
``tests/test_turn_with_request.py`` counts those.)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg

from tests.pg import PgCluster, next_xid
from tests.test_host import LIMIT, Pay, model, until
from tests.test_store import LEASE, NOW, fresh_state, turn_state
from toolnexus_async import Answer, Inbox, LlmClient, Request, StoreError
from toolnexus_async.durable import DurableHost, PostgresRunStore, StoreEvent
from toolnexus_async.durable.postgres._ops import CHANNEL
from toolnexus_async.testing import tool_call

# Generous: the writers, the lock and pg_ctl on a loaded machine.
CRASH_LIMIT = 120.0


async def _write_transactions(dsn: str, runs: int, together: int) -> float:
    """Write transactions per run over ``runs`` runs, ``together`` at a time, each begun,
    parked, answered on the same host and done."""
    pay = Pay()
    inbox = Inbox()
    async with (
        PostgresRunStore(dsn) as store,
        LlmClient.in_process(model, wait_for=inbox) as client,
        # No sweep, renewal or poll in the window: only the runs' own writes count.
        DurableHost(client, pay.toolkit, store, lease=600, sweep=600, poll=600) as host,
    ):
        await _round(host, inbox, 1)  # warm: the schema, the worker's lease row
        before = await next_xid(dsn)
        for _ in range(runs // together):
            await _round(host, inbox, together)
        after = await next_xid(dsn)
    return (after - before) / runs  # _next_xid reads: it takes no transaction id itself


async def _round(host: DurableHost, inbox: Inbox, together: int) -> None:
    done: list[Any] = []

    async def one() -> None:
        begun = await host.begin("pay")
        done.append(await begun.run())

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            for _ in range(together):
                tg.start_soon(one)
            await until(lambda: len(inbox) == together)
            for request in inbox.pending():
                tg.start_soon(host.answer, Answer(request.id, True))
    assert [(r.status, r.text) for r in done] == [("done", "result: paid")] * together


async def test_a_run_alone_takes_six_write_transactions(pg_dsn: str):
    # start; turn; suspension (its NOTIFY inside); answer (the same worker: no NOTIFY);
    # the tool's result; the end. (It was 8: two NOTIFY-only transactions.)
    per_run = await _write_transactions(pg_dsn, runs=10, together=1)
    assert per_run <= 6.0, per_run


async def test_runs_that_go_together_share_their_transactions(pg_dsn: str):
    per_run = await _write_transactions(pg_dsn, runs=60, together=30)
    assert per_run <= 1.0, per_run


async def test_alike_writes_of_one_batch_go_as_one_and_each_refusal_stays_its_own(pg_dsn: str):
    """Queued at once, the writes share one transaction (one statement per kind); a write
    that is refused in it is refused as it always was, and the others are taken."""
    async with PostgresRunStore(pg_dsn) as store:
        await store.start(fresh_state("run_a"), "A", NOW + LEASE)
        await store.start(fresh_state("run_b"), "A", NOW + LEASE)
        outcomes: dict[str, Any] = {}

        async def outcome(name: str, write: Awaitable[None]) -> None:
            try:
                await write
                outcomes[name] = None
            except Exception as exc:
                outcomes[name] = type(exc).__name__

        before = await next_xid(pg_dsn)
        calls = [tool_call("pay", id="c1")]
        async with anyio.create_task_group() as tg:
            tg.start_soon(outcome, "turn a", store.turn(turn_state("run_a", *calls), 1, "A"))
            tg.start_soon(
                outcome, "turn b, not B's", store.turn(turn_state("run_b", *calls), 1, "B")
            )
            tg.start_soon(outcome, "new", store.start(fresh_state("run_c"), "A", NOW + LEASE))
            tg.start_soon(outcome, "taken", store.start(fresh_state("run_a"), "A", NOW + LEASE))
        assert await next_xid(pg_dsn) - before == 1  # one transaction for all four
        assert outcomes == {
            "turn a": None,
            "turn b, not B's": "LeaseLostError",
            "new": None,
            "taken": "UsageError",
        }
        assert {r.run_id for r in await store.runs()} == {"run_a", "run_b", "run_c"}
        assert [(await store.load(r)).turn for r in ("run_a", "run_b", "run_c")] == [1, 0, 0]


async def test_requests_raised_together_each_keep_when_they_were_raised(pg_dsn: str):
    """Suspensions of one batch go as one statement, and each request still keeps its
    raise time (what a resumed run's wait span starts from)."""
    async with PostgresRunStore(pg_dsn) as store:
        runs = ("run_a", "run_b", "run_c")
        for run_id in runs:
            await store.start(fresh_state(run_id), "A", NOW + LEASE)
            await store.turn(turn_state(run_id, tool_call("pay", id="c1")), 1, "A")
        before, since = await next_xid(pg_dsn), time.time()
        async with anyio.create_task_group() as tg:
            for run_id in runs:
                tg.start_soon(
                    store.suspend, run_id, "c1", Request(f"req_{run_id}", "approval", "pay?"), "A"
                )
        assert await next_xid(pg_dsn) - before == 1  # one batch
        for run_id in runs:
            (kept,) = (await store.load(run_id)).requests.values()
            assert kept.request.id == f"req_{run_id}"
            assert kept.raised_at is not None and since <= kept.raised_at <= time.time()


async def test_a_lone_write_rolled_back_by_a_deadlock_goes_again(pg_dsn: str):
    """A write alone in its transaction can still be the victim of a deadlock with other
    workers' batches (three workers answering at once showed it): PostgreSQL rolled it
    back whole, so it goes again, and its caller sees it committed, not a refusal. A
    trigger makes the first try fail as the deadlock detector does (SQLSTATE 40P01)."""
    async with PostgresRunStore(pg_dsn) as store:
        await store.start(fresh_state("run_a"), "A", NOW + LEASE)  # the schema made
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(
                "CREATE SEQUENCE public.tries;"
                " CREATE FUNCTION public.victim() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN IF nextval('public.tries') = 1 THEN"
                " RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END IF;"
                " RETURN NEW; END $$;"
                " CREATE TRIGGER victim BEFORE INSERT ON toolnexus.runs"
                " FOR EACH ROW EXECUTE FUNCTION public.victim()"
            )
            await store.start(fresh_state("run_b"), "A", NOW + LEASE)
            assert await conn.fetchval("SELECT last_value FROM public.tries") == 2
        finally:
            await conn.close()
        assert {r.run_id for r in await store.runs()} == {"run_a", "run_b"}


async def test_a_worker_hears_only_the_answers_it_must_act_on(pg_dsn: str):
    """Routed, not broadcast: a host's listener (``owner=``) hears an answer another worker
    took for a run it holds, and nothing of other workers' runs or of its own requests."""
    heard: dict[str, list[StoreEvent]] = {"A": [], "C": [], "all": []}
    told = anyio.Event()

    def hear(who: str) -> Callable[[StoreEvent], None]:
        def tell(event: StoreEvent) -> None:
            heard[who].append(event)
            if len(heard["all"]) == 4:
                told.set()

        return tell

    async with (
        PostgresRunStore(pg_dsn) as a,
        PostgresRunStore(pg_dsn) as b,
        PostgresRunStore(pg_dsn) as c,
        PostgresRunStore(pg_dsn) as watcher,
    ):
        await a.listen(hear("A"), owner="A")
        await c.listen(hear("C"), owner="C")
        await watcher.listen(hear("all"))
        for run_id, owner in (("run_a", "A"), ("run_c", "C")):
            await a.start(fresh_state(run_id), owner, NOW + LEASE)
            await a.turn(turn_state(run_id, tool_call("pay", id="c1")), 1, owner)
            await a.suspend(run_id, "c1", Request(f"req_{run_id}", "approval", "Pay?"), owner)
        await b.accept(Answer("req_run_a", True), NOW, by="B")
        await c.accept(Answer("req_run_c", True), NOW, by="C")  # taken by its own holder
        with anyio.fail_after(LIMIT):
            await told.wait()
    assert heard["A"] == [StoreEvent("answered", "req_run_a", "run_a", "A")]
    assert heard["C"] == []
    assert [(e.kind, e.request_id) for e in heard["all"]] == [
        ("requested", "req_run_a"),
        ("requested", "req_run_c"),
        ("answered", "req_run_a"),
        ("answered", "req_run_c"),
    ]


async def test_the_database_stopped_under_a_group_commit_acknowledges_only_what_it_kept(
    pg_cluster: PgCluster,
):
    """Writers keep the group commit busy; a batch is held mid-transaction (another
    session locks the runs table under it) and the server is killed (``pg_ctl stop -m
    immediate``). After the restart every write that returned is there, none of those cut
    off is, and the writes shared their transactions (fewer than writes)."""
    dsn = pg_cluster.server.dsn
    acknowledged: set[str] = set()
    unanswered: set[str] = set()
    held = anyio.Event()

    async def writer(store: PostgresRunStore, w: int) -> None:
        for i in itertools.count():
            run_id = f"run_{w}_{i}"
            if held.is_set():
                return
            unanswered.add(run_id)
            try:
                await store.start(fresh_state(run_id), "A", NOW + LEASE)
            except StoreError:
                return
            unanswered.discard(run_id)
            acknowledged.add(run_id)

    async with PostgresRunStore(dsn, command_timeout=LIMIT) as store:
        await store.ping()
        before = await next_xid(dsn)
        locker = await asyncpg.connect(dsn)
        try:
            with anyio.fail_after(CRASH_LIMIT):
                async with anyio.create_task_group() as tg:
                    for w in range(40):
                        tg.start_soon(writer, store, w)
                    await until(lambda: len(acknowledged) >= 200)
                    await locker.execute("BEGIN; LOCK TABLE toolnexus.runs IN EXCLUSIVE MODE")
                    # A waiter on the table's lock, whatever its statement shows: a batch
                    # whose statement is not yet prepared on its connection waits in the
                    # parse, while pg_stat_activity still shows its BEGIN (1 run in 10 on
                    # a loaded machine, which then polled until CRASH_LIMIT).
                    while not await locker.fetchval(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted"
                        " AND relation = 'toolnexus.runs'::regclass"
                    ):
                        # Each look is a round trip to the server: no pause needed.
                        assert unanswered, "every writer stopped before a batch was held"
                    held.set()  # a batch is inside its transaction, waiting: in flight
                    cut = set(unanswered)
                    await anyio.to_thread.run_sync(pg_cluster.crash)
        finally:
            locker.terminate()
    await anyio.to_thread.run_sync(pg_cluster.start)
    conn = await asyncpg.connect(dsn)
    try:
        kept = {row[0] for row in await conn.fetch("SELECT run_id FROM toolnexus.runs")}
    finally:
        await conn.close()
    after = await next_xid(dsn)
    assert cut and not cut & acknowledged
    assert acknowledged <= kept, sorted(acknowledged - kept)[:10]
    assert not cut & kept, sorted(cut & kept)[:10]
    assert after - before < len(acknowledged) / 4, (after - before, len(acknowledged))


async def test_nothing_is_broadcast_while_nobody_listens_to_every_event(pg_dsn: str):
    """Every worker's session is woken by each notifying commit of the database, whatever
    its channel: the channel of every event is notified only while a store listens there."""
    raw: list[str] = []
    spy = await asyncpg.connect(pg_dsn)  # LISTENs, but says nothing to the writers
    try:
        await spy.add_listener(CHANNEL, lambda *args: raw.append(args[-1]))
        async with PostgresRunStore(pg_dsn) as writer:
            await writer.start(fresh_state("run_1"), "A", NOW + LEASE)
            await writer.suspend("run_1", "c1", Request("req_1", "approval", "Pay?"), "A")
            await spy.execute("SELECT 1")  # a notification sent would be read by now
            assert raw == []
            heard = anyio.Event()
            async with PostgresRunStore(pg_dsn) as watcher:
                await watcher.listen(lambda event: heard.set())
                await writer.suspend("run_1", "c2", Request("req_2", "approval", "Pay?"), "A")
                with anyio.fail_after(LIMIT):
                    await heard.wait()
        await spy.execute("SELECT 1")
        assert len(raw) == 1 and "req_2" in raw[0]
    finally:
        await spy.close()
