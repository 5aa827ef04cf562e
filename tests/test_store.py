"""The run store contract (the journal), run once per store, and SQLite's file rules.

Every contract test here runs against MemoryRunStore, SqliteRunStore and PostgresRunStore (a
real server, started by tests/pg.py) alike: the contract is one.
Times are passed in explicitly where a rule depends on them (leases, expiry), so nothing
sleeps.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest

from tests.conftest import assert_no_leaks
from tests.shared import Ledger, raw_sql
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    LlmClient,
    PayloadError,
    Request,
    RequestExpiredError,
    RunResult,
    StoreError,
    ToolCall,
    ToolCallRecord,
    Toolkit,
    ToolResult,
    UnknownRequestError,
    UsageError,
)
from toolnexus_async._core.loop import RunLoop
from toolnexus_async.durable import (
    LeaseLostError,
    MemoryRunStore,
    PostgresRunStore,
    RunStore,
    SqliteRunStore,
    StoreEvent,
)
from toolnexus_async.durable.sqlite._schema import APPLICATION_ID, SCHEMA_VERSION
from toolnexus_async.testing import ScriptedModel, reply, tool_call

StoreFactory = Callable[..., RunStore]
NOW = 1_900_000_000.0  # a fixed "now", seconds since the epoch
LEASE = 30.0


@attrs.define
class Case:
    """A run halted on two suspended calls (pay, notify) after one completed (lookup)."""

    ledger: Ledger
    toolkit: Toolkit
    halted: RunResult

    @property
    def ids(self) -> list[str]:
        return [r.request.id for r in self.halted.suspended if r.request is not None]


async def halt(toolkit: Toolkit) -> RunResult:
    calls = [
        tool_call("lookup", {"invoice": "INV-1"}, id="c1"),
        tool_call("pay", {"amount": 30}, id="c2"),
        tool_call("notify", id="c3"),
    ]
    async with LlmClient.in_process(ScriptedModel(reply(*calls)), model="m") as client:
        return await client.run("pay INV-1", toolkit)


@pytest.fixture
async def case() -> Case:
    ledger = Ledger()
    toolkit = ledger.toolkit()
    return Case(ledger, toolkit, await halt(toolkit))


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_kind(request: Any) -> str:
    return str(request.param)


@pytest.fixture
def database(store_kind: str, request: Any) -> str | None:
    """A fresh PostgreSQL database for the postgres case (a real server: tests/pg.py)."""
    return str(request.getfixturevalue("pg_dsn")) if store_kind == "postgres" else None


@pytest.fixture
async def make_store(
    store_kind: str, database: str | None, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    """A factory of stores of one kind; every store it made is closed afterwards."""
    made: list[RunStore] = []

    def make(**options: Any) -> RunStore:
        store: RunStore
        if store_kind == "sqlite":
            store = SqliteRunStore(tmp_path / "runs.db", **options)
        elif store_kind == "postgres":
            assert database is not None
            store = PostgresRunStore(database, **options)
        else:
            store = MemoryRunStore(**options)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()


@pytest.fixture
def store(make_store: StoreFactory) -> RunStore:
    return make_store()


def fresh_state(run_id: str = "run_1", prompt: str = "go") -> RunResult:
    return RunLoop(prompt, run_id=run_id, style="in-process").snapshot()


def turn_state(run_id: str = "run_1", *calls: ToolCall) -> RunResult:
    loop = RunLoop("go", run_id=run_id, style="in-process")
    from toolnexus_async import ModelReply

    loop.model_replied(ModelReply(reply(*calls)))
    return loop.snapshot()


def in_seconds(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


# -- saving a halted run, and reading it back ---------------------------------------------


def test_the_sqlite_store_binds_plain_question_marks_only() -> None:
    """A numbered ``?5`` beside a sequence of parameters is a DeprecationWarning on Python
    3.12 and 3.13 (an error in the suite) and refused by sqlite3 from 3.14; CI runs 3.11,
    which says nothing, so the SQL of the SQLite store's modules is read here."""
    durable = Path(__file__).resolve().parent.parent / "toolnexus_async" / "durable"
    numbered = re.compile(r"\?\d")
    found = [
        f"{path.name}:{number}"
        for path in sorted(durable.glob("*.py"))
        if not path.name.startswith("_pg")  # asyncpg's $1 placeholders, another driver
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if numbered.search(line)
    ]
    assert found == []


async def test_a_saved_run_lists_its_requests_and_loads_where_it_stood(store, case):
    await store.save(case.halted)
    assert [r.id for r in await store.requests()] == case.ids
    outstanding = await store.outstanding()
    assert [(s.run_id, s.call_id) for s in outstanding] == [
        (case.halted.run_id, "c2"),
        (case.halted.run_id, "c3"),
    ]
    stored = await store.load(case.halted.run_id)
    assert (stored.status, stored.turn, stored.owner) == ("halted", 1, None)
    assert list(stored.results) == ["c1"] and stored.results["c1"].result.output == "INV-1: 30 EUR"
    assert {c: r.status for c, r in stored.requests.items()} == {"c2": "pending", "c3": "pending"}
    assert stored.state.messages[-1].tool_calls[1].id == "c2"
    found = await store.find(case.ids[0])
    assert (found.run_id, found.call_id, found.status) == (case.halted.run_id, "c2", "pending")
    with pytest.raises(UnknownRequestError):
        await store.find("req_nobody")
    with pytest.raises(UnknownRequestError):
        await store.load("run_nobody")


async def test_saving_again_replaces_and_a_foreign_request_id_is_refused(store, case):
    await store.save(case.halted)
    await store.save(case.halted)
    assert [r.id for r in await store.requests()] == case.ids
    thief = attrs.evolve(case.halted, run_id="run_thief")
    with pytest.raises(UsageError, match="already filed under run"):
        await store.save(thief)


async def test_only_a_halted_json_run_with_an_id_is_saved(store, case):
    done = attrs.evolve(case.halted, status="done", suspended=(), pending=None)
    with pytest.raises(UsageError, match="only a halted run"):
        await store.save(done)
    with pytest.raises(UsageError, match="run_id"):
        await store.save(attrs.evolve(case.halted, run_id=""))
    record = case.halted.tool_calls[0]
    odd = attrs.evolve(record, result=ToolResult.ok("x", {"when": object()}))
    with pytest.raises(PayloadError):
        await store.save(attrs.evolve(case.halted, tool_calls=(odd, *case.halted.tool_calls[1:])))


# -- one answer per request ---------------------------------------------------------------


async def test_an_answer_is_taken_once_and_a_second_is_refused(store, case):
    await store.save(case.halted)
    accepted = await store.accept(Answer(case.ids[0], True), NOW)
    assert (accepted.run_id, accepted.call_id, accepted.owner) == (case.halted.run_id, "c2", None)
    assert accepted.request.prompt == "Pay 30 EUR?"
    with pytest.raises(AlreadyAnsweredError):
        await store.accept(Answer(case.ids[0], False, reason="declined"), NOW)
    assert (await store.find(case.ids[0])).answer == Answer(case.ids[0], True)
    assert [r.id for r in await store.requests()] == [case.ids[1]]  # answered: not listed
    with pytest.raises(UnknownRequestError):
        await store.accept(Answer("req_nobody", True), NOW)


async def test_many_concurrent_answers_to_one_request_take_exactly_one(store, case):
    await store.save(case.halted)
    outcomes: list[str] = []

    async def answer(i: int) -> None:
        try:
            await store.accept(Answer(case.ids[0], i % 2 == 0, data={"i": i}), NOW)
            outcomes.append(f"ok {i}")
        except AlreadyAnsweredError:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(answer, i)
    winners = [o for o in outcomes if o.startswith("ok")]
    assert len(winners) == 1 and outcomes.count("refused") == 49
    taken = (await store.find(case.ids[0])).answer
    assert taken is not None and taken.data == {"i": int(winners[0].split()[1])}


async def test_an_expired_request_is_not_listed_and_its_answer_refused(store, case):
    request = Request("req_soon", "approval", "Pay?", expires_at=in_seconds(5))
    halted = attrs.evolve(
        case.halted,
        suspended=(attrs.evolve(case.halted.suspended[0], request=request),),
        pending=request,
    )
    await store.save(halted)
    assert [r.id for r in await store.requests(time.time())] == ["req_soon"]
    assert await store.requests(time.time() + 60) == []
    with pytest.raises(RequestExpiredError):
        await store.accept(Answer("req_soon", True), time.time() + 60)
    assert (await store.find("req_soon")).status == "expired"
    with pytest.raises(RequestExpiredError):  # it stays expired
        await store.accept(Answer("req_soon", True), time.time())


# -- leases ----------------------------------------------------------------------------


async def test_a_run_is_claimed_by_one_worker_until_its_lease_runs_out(store, case):
    await store.save(case.halted)
    run_id = case.halted.run_id
    mine = await store.claim(run_id, "A", NOW + LEASE, NOW)
    assert mine is not None and (mine.status, mine.owner) == ("running", "A")
    assert await store.claim(run_id, "B", NOW + LEASE, NOW + 1) is None  # A holds it
    await store.renew("A", NOW + 2 * LEASE)
    assert await store.claim(run_id, "B", NOW + 3 * LEASE, NOW + LEASE + 1) is None  # renewed
    taken = await store.claim(run_id, "B", NOW + 4 * LEASE, NOW + 2 * LEASE + 1)
    assert taken is not None and taken.owner == "B"
    with pytest.raises(LeaseLostError, match="not held by this worker"):
        await store.record(run_id, case.halted.tool_calls[0], "A")
    await store.record(run_id, case.halted.tool_calls[0], "B")


async def test_ready_finds_what_can_go_on_and_only_that(store, case):
    await store.save(case.halted)
    run_id = case.halted.run_id
    assert await store.ready(NOW, 10) == []  # halted, nothing answered
    await store.accept(Answer(case.ids[0], True), NOW)
    assert await store.ready(NOW, 10) == [run_id]
    assert await store.claim(run_id, "A", NOW + LEASE, NOW) is not None
    assert await store.ready(NOW + 1, 10) == []  # A holds it
    assert await store.ready(NOW + LEASE + 1, 10) == [run_id]  # A died: its lease ran out
    await store.release(run_id, "A")
    assert await store.ready(NOW + 1, 10) == [run_id]  # let go mid-way: anyone goes on


async def test_a_run_goes_from_start_through_turns_to_its_end(store):
    await store.start(fresh_state(), "A", NOW + LEASE)
    with pytest.raises(UsageError, match="unique"):
        await store.start(fresh_state(), "A", NOW + LEASE)
    call = tool_call("pay", {"amount": 3}, id="c1")
    await store.turn(turn_state("run_1", call), 1, "A")
    request = Request("req_1", "approval", "Pay 3?")
    await store.suspend("run_1", "c1", request, "A")
    assert [r.id for r in await store.requests()] == ["req_1"]
    stored = await store.load("run_1")
    assert (stored.turn, stored.requests["c1"].status, stored.owner) == (1, "pending", "A")

    await store.accept(Answer("req_1", True), NOW, delivered=True)
    assert await store.deliveries("A") == []  # handed over by A itself
    record = ToolCallRecord(call, ToolResult.ok("paid 3"), 1, request, True)
    await store.record("run_1", record, "A")
    assert await store.requests() == []
    done = RunResult("done", "paid", turn_state("run_1", call).messages, run_id="run_1")
    await store.finish(done, "A")
    (summary,) = await store.runs()
    assert (summary.run_id, summary.status, summary.prompt, summary.text) == (
        "run_1",
        "done",
        "go",
        "paid",
    )
    with pytest.raises(AlreadyAnsweredError):
        await store.accept(Answer("req_1", True), NOW)  # late answers are told what happened
    with pytest.raises(LeaseLostError):
        await store.record("run_1", record, "A")


async def test_concurrent_writers_are_each_told_their_own_outcome(store, store_kind):
    """Writers of many batches at once: each is told its own outcome (a refusal raises in
    its caller alone); with group commit (SQLite), a writer cancelled while it waits is
    committed all the same."""
    runs = [f"run_{n}" for n in range(300)]
    refused: list[str] = []
    started: list[str] = []

    async def start(run_id: str) -> None:
        await store.start(fresh_state(run_id), "A", NOW + LEASE)
        started.append(run_id)

    async def restart(run_id: str) -> None:
        try:
            await store.start(fresh_state(run_id), "A", NOW + LEASE)
        except UsageError:
            refused.append(run_id)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for run_id in runs:
                tg.start_soon(start, run_id)
        async with anyio.create_task_group() as tg:
            for run_id in runs[:150]:
                tg.start_soon(restart, run_id)  # stored already: refused, changes nothing
            for run_id in runs[150:]:
                tg.start_soon(store.halt, run_id, "A")
            async with anyio.create_task_group() as doomed:
                doomed.start_soon(store.fail, "run_0", "gave up", "A")
                await anyio.lowlevel.checkpoint()  # queued; its caller is cancelled while it waits
                doomed.cancel_scope.cancel()
    assert sorted(started) == sorted(runs) and sorted(refused) == sorted(runs[:150])
    statuses = {summary.run_id: summary.status for summary in await store.runs()}
    if store_kind != "postgres":
        assert statuses["run_0"] == "error"  # the cancelled caller's write was committed
    assert {statuses[r] for r in runs[150:]} == {"pending"}
    assert {statuses[r] for r in runs[1:150]} == {"running"}


async def test_a_write_started_while_a_commit_is_in_flight_is_a_coroutine(store):
    """The writes are coroutine functions, as the RunStore protocol says, whether or not
    a commit is in flight: ``start_soon`` and ``create_task`` take them at any time."""
    runs = [f"run_{n}" for n in range(20)]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.start, fresh_state(runs[0]), "A", NOW + LEASE)
            await anyio.lowlevel.checkpoint()  # its commit is in flight now
            for run_id in runs[1:]:
                tg.start_soon(store.start, fresh_state(run_id), "A", NOW + LEASE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.halt, runs[0], "A")
            await anyio.lowlevel.checkpoint()
            for run_id in runs[1:]:
                tg.start_soon(store.halt, run_id, "A")
    statuses = {summary.run_id: summary.status for summary in await store.runs()}
    assert {statuses[r] for r in runs} == {"pending"}


async def test_answers_another_worker_took_are_delivered_once(store):
    await store.start(fresh_state(), "A", NOW + LEASE)
    call = tool_call("pay", id="c1")
    await store.turn(turn_state("run_1", call), 1, "A")
    await store.suspend("run_1", "c1", Request("req_1", "approval", "Pay?"), "A")
    await store.accept(Answer("req_1", True), NOW)  # by worker B, say
    assert await store.deliveries("A") == [("run_1", Answer("req_1", True))]
    assert await store.deliveries("B") == []
    await store.delivered(["req_1"])
    assert await store.deliveries("A") == []


async def test_listeners_hear_requests_and_answers_named_never_their_data(store):
    heard: list[StoreEvent] = []
    told, events = anyio.create_memory_object_stream[StoreEvent](10)

    def hear(event: StoreEvent) -> None:
        heard.append(event)
        told.send_nowait(event)

    async def next_event() -> StoreEvent:
        with anyio.fail_after(10):  # PostgreSQL tells through its server, not at once
            return await events.receive()

    async with told, events:
        stop = await store.listen(hear)
        await store.start(fresh_state(), "A", NOW + LEASE)
        calls = [tool_call("pay", id="c1"), tool_call("notify", id="c2")]
        await store.turn(turn_state("run_1", *calls), 1, "A")
        secret = Request("req_1", "approval", "Pay?", data={"iban": "SECRET-IBAN"})
        await store.suspend("run_1", "c1", secret, "A")
        assert await next_event() == StoreEvent("requested", "req_1", "run_1", "A")
        await store.suspend("run_1", "c2", Request("req_2", "input", "Who?"), "A")
        assert await next_event() == StoreEvent("requested", "req_2", "run_1", "A")
        await store.accept(Answer("req_1", True, data={"pin": "SECRET-PIN"}), NOW)  # by B
        assert await next_event() == StoreEvent("answered", "req_1", "run_1", "A")
        await store.accept(Answer("req_2", True), NOW, delivered=True)  # by A, in memory
        assert await next_event() == StoreEvent("answered", "req_2", "run_1", "A", True)
        stop()
        await store.halt("run_1", "A")
    assert "SECRET" not in repr(heard) and len(heard) == 4


async def test_a_failed_run_is_listed_as_an_error_and_not_ready(store):
    await store.start(fresh_state(), "A", NOW + LEASE)
    await store.fail("run_1", "ProviderError: 400", "A")
    (summary,) = await store.runs()
    assert (summary.status, summary.error) == ("error", "ProviderError: 400")
    assert await store.ready(NOW + 2 * LEASE, 10) == []


async def test_ended_runs_are_kept_within_a_bound(make_store, store_kind):
    # PostgreSQL prunes every prune_every seconds (10 by default), here at every end.
    store = make_store(keep_finished=2, **({"prune_every": 0} if store_kind == "postgres" else {}))
    for n in range(4):
        run_id = f"run_{n}"
        await store.start(fresh_state(run_id), "A", NOW + LEASE)
        await store.finish(RunResult("done", f"text {n}", (), run_id=run_id), "A")
    assert [r.run_id for r in await store.runs()] == ["run_3", "run_2"]


async def test_a_closed_store_refuses_work(make_store, case):
    store = make_store()
    await store.save(case.halted)
    await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(UsageError, match="closed"):
        await store.requests()
    with pytest.raises(UsageError, match="closed"):
        await store.save(case.halted)
    assert_no_leaks()


# -- SQLite's file ------------------------------------------------------------------------


async def race_two_stores(one: RunStore, two: RunStore, case: Case) -> None:
    """Two stores on one journal (as two processes) race to answer a request of the halted
    run, approving and declining, and to claim the run: one answer and one claim win, and
    the answer kept is the one taken."""
    await one.save(case.halted)
    taken: list[Answer] = []

    async def answer(store: RunStore, ok: bool) -> None:
        try:
            await store.accept(Answer(case.ids[0], ok), NOW)
        except AlreadyAnsweredError:
            return
        taken.append(Answer(case.ids[0], ok))

    claims: list[object] = []

    async def claim(store: RunStore, worker: str) -> None:
        claims.append(await store.claim(case.halted.run_id, worker, NOW + LEASE, NOW))

    async with anyio.create_task_group() as tg:
        for n in range(10):
            tg.start_soon(answer, one, n % 2 == 0)
            tg.start_soon(answer, two, n % 2 == 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(claim, one, "A")
        tg.start_soon(claim, two, "B")
    assert len(taken) == 1
    assert (await two.find(case.ids[0])).answer == taken[0]
    assert sorted(c is None for c in claims) == [False, True]


async def test_two_stores_on_one_file_take_one_answer_and_one_claim(tmp_path: Path, case):
    path = tmp_path / "runs.db"
    async with SqliteRunStore(path) as one, SqliteRunStore(path) as two:
        await race_two_stores(one, two, case)
    assert_no_leaks()


@pytest.mark.parametrize("kind", ["newer schema", "other application", "not a database"])
async def test_a_file_not_ours_or_newer_is_refused_and_not_touched(tmp_path, case, kind):
    path = tmp_path / "runs.db"
    if kind == "newer schema":
        async with SqliteRunStore(path) as store:
            await store.save(case.halted)
        raw_sql(path, "PRAGMA user_version = 9")
    elif kind == "other application":
        raw_sql(path, "CREATE TABLE notes (text TEXT)")
    else:
        path.write_bytes(b"definitely not sqlite " * 100)
    before = path.read_bytes()
    message = {"newer schema": r"version 9.*newer", "other application": "another application"}
    with pytest.raises(StoreError, match=message.get(kind, "cannot be opened")):
        async with SqliteRunStore(path):
            pass
    assert path.read_bytes() == before
    assert_no_leaks()


async def test_a_version_1_file_is_migrated_when_opened(tmp_path: Path, case):
    """The schema of the first release (halted runs only): its runs stay answerable."""
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "CREATE TABLE runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL"
            " UNIQUE, created REAL NOT NULL, body TEXT NOT NULL)"
        )
        db.execute("CREATE TABLE requests (request_id TEXT PRIMARY KEY, run_id TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE claimed (seq INTEGER PRIMARY KEY AUTOINCREMENT, request_id TEXT NOT"
            " NULL UNIQUE, run_id TEXT NOT NULL, claimed REAL NOT NULL)"
        )
        db.execute(
            "INSERT INTO runs (run_id, created, body) VALUES (?, 0, ?)",
            (case.halted.run_id, json.dumps(case.halted.to_dict())),
        )
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute("PRAGMA user_version = 1")
    async with SqliteRunStore(path) as store:
        assert [r.id for r in await store.requests()] == case.ids
        await store.set_mcp_token("k", '{"a": 1}')
        assert await store.mcp_token("k") == '{"a": 1}'
    assert raw_sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


async def test_a_version_3_file_gains_the_mcp_tokens_table_and_keeps_its_runs(tmp_path: Path, case):
    """Version 4 added ``mcp_tokens`` (the sign-in state of remote MCP servers), nothing else."""
    path = tmp_path / "v3.db"
    async with SqliteRunStore(path) as store:
        await store.save(case.halted)
    raw_sql(path, "DROP TABLE mcp_tokens")
    raw_sql(path, "DROP TABLE answers")  # version 5's (its triggers go with it)
    raw_sql(path, "ALTER TABLE requests DROP COLUMN raised_at")  # version 6's
    raw_sql(path, "PRAGMA user_version = 3")
    async with SqliteRunStore(path) as store:
        assert [r.id for r in await store.requests()] == case.ids
        assert await store.mcp_token("k") is None
        await store.set_mcp_token("k", '{"a": 1}')
        assert await store.mcp_token("k") == '{"a": 1}'
        await store.set_mcp_token("k", None)
        assert await store.mcp_token("k") is None
    assert raw_sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert_no_leaks()


async def test_a_corrupt_run_fails_alone_naming_it(tmp_path: Path, case):
    path = tmp_path / "runs.db"
    async with SqliteRunStore(path) as store:
        await store.save(case.halted)
        raw_sql(path, "UPDATE runs SET state = '{not json' WHERE run_id = ?", case.halted.run_id)
        with pytest.raises(StoreError, match=rf"'{case.halted.run_id}'.*cannot be read"):
            await store.load(case.halted.run_id)
        assert [r.id for r in await store.requests()] == case.ids  # listing goes on
    assert_no_leaks()


# -- a damaged request row: its run fails alone ----------------------------------------------


async def damage(store_kind: str, where: Path | str, column: str, run_id: str) -> None:
    """Write JSON that does not parse into ``column`` of a run's ``requests`` rows. (The
    table layout is internal: this only plays a row gone bad.)"""
    if store_kind == "sqlite":
        raw_sql(
            Path(where), f"UPDATE requests SET {column} = '{{not json' WHERE run_id = ?", run_id
        )
        return
    import asyncpg

    conn = await asyncpg.connect(str(where))
    try:
        await conn.execute(
            f"UPDATE toolnexus.requests SET {column} = '{{not json' WHERE run_id = $1", run_id
        )
    finally:
        await conn.close()


def damaged_where(store_kind: str, tmp_path: Path, database: str | None) -> Path | str:
    return tmp_path / "runs.db" if store_kind == "sqlite" else str(database)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_a_damaged_request_fails_its_run_alone(
    store_kind, store, case, tmp_path, database, caplog
):
    other = await halt(case.toolkit)
    other_ids = [r.request.id for r in other.suspended if r.request is not None]
    await store.save(case.halted)
    await store.save(other)
    await damage(
        store_kind, damaged_where(store_kind, tmp_path, database), "body", case.halted.run_id
    )

    with caplog.at_level(logging.WARNING, logger="toolnexus_async.durable"):
        assert [r.id for r in await store.requests()] == other_ids
        assert {s.run_id for s in await store.outstanding()} == {other.run_id}
    assert any(repr(case.halted.run_id) in r.getMessage() for r in caplog.records)
    with pytest.raises(StoreError, match=rf"'{case.halted.run_id}'.*cannot be read"):
        await store.find(case.ids[0])
    assert (await store.find(other_ids[0])).status == "pending"

    # Two answers at once (one transaction on SQLite): the damaged run's is refused alone.
    outcomes: dict[str, object] = {}

    async def answer(request_id: str) -> None:
        try:
            outcomes[request_id] = await store.accept(Answer(request_id, True), NOW)
        except StoreError as exc:
            outcomes[request_id] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer, case.ids[0])
        tg.start_soon(answer, other_ids[0])
    refused = outcomes[case.ids[0]]
    assert isinstance(refused, StoreError) and repr(case.halted.run_id) in str(refused)
    assert not isinstance(outcomes[other_ids[0]], Exception)
    assert (await store.find(other_ids[0])).status == "answered"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # refused, not undone
    if store_kind == "sqlite":  # the refusal changed nothing
        assert raw_sql(
            tmp_path / "runs.db",
            "SELECT status, answer FROM requests WHERE request_id = ?",
            case.ids[0],
        ) == [("pending", None)]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_a_damaged_answer_is_left_out_of_deliveries(
    store_kind, store, case, tmp_path, database, caplog
):
    other = await halt(case.toolkit)
    other_ids = [r.request.id for r in other.suspended if r.request is not None]
    for run, ids in ((case.halted, case.ids), (other, other_ids)):
        await store.save(run)
        assert await store.claim(run.run_id, "W", NOW + LEASE, NOW) is not None
        await store.accept(Answer(ids[0], True), NOW)
    await damage(
        store_kind, damaged_where(store_kind, tmp_path, database), "answer", case.halted.run_id
    )
    with caplog.at_level(logging.WARNING, logger="toolnexus_async.durable"):
        assert await store.deliveries("W") == [(other.run_id, Answer(other_ids[0], True))]
    assert any(repr(case.halted.run_id) in r.getMessage() for r in caplog.records)
    with pytest.raises(StoreError, match=rf"'{case.halted.run_id}'.*cannot be read"):
        await store.find(case.ids[0])
