"""What the PostgreSQL store adds to the contract (which tests/test_store.py runs on it too).

Several stores on one database are several workers: exactly one of them takes an answer or
a claim; each is told what the others commit (LISTEN/NOTIFY), naming the request and never
its data; a schema that is not ours, or newer, is refused untouched; a bad row fails alone;
the DSN's password never shows. A real server (tests/pg.py), never a mock.
"""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from tests.conftest import assert_no_leaks
from tests.shared import Ledger
from tests.test_store import LEASE, NOW, Case, fresh_state, halt, race_two_stores
from toolnexus_async import Answer, Request, StoreError, UsageError
from toolnexus_async.durable import PostgresRunStore, StoreEvent
from toolnexus_async.durable.postgres._schema import SCHEMA_VERSION

LIMIT = 10


@pytest.fixture
async def case() -> Case:
    ledger = Ledger()
    toolkit = ledger.toolkit()
    return Case(ledger, toolkit, await halt(toolkit))


async def test_two_workers_on_one_database_take_one_answer_and_one_claim(pg_dsn: str, case: Case):
    async with PostgresRunStore(pg_dsn) as one, PostgresRunStore(pg_dsn) as two:
        await race_two_stores(one, two, case)
    assert_no_leaks()


async def test_every_worker_is_told_what_another_committed_and_no_data(pg_dsn: str, case: Case):
    seen: list[StoreEvent] = []
    told, heard = anyio.create_memory_object_stream[StoreEvent](10)

    def tell(event: StoreEvent) -> None:
        seen.append(event)
        told.send_nowait(event)

    async with told, heard, PostgresRunStore(pg_dsn) as writer, PostgresRunStore(pg_dsn) as other:
        stop = await other.listen(tell)
        await writer.start(fresh_state("run_n"), "A", NOW + LEASE)
        secret = Request("req_n", "approval", "Pay 30 EUR?", data={"iban": "DE00 SECRET"})
        await writer.suspend("run_n", "c1", secret, "A")
        with anyio.fail_after(LIMIT):
            await heard.receive()
        await writer.accept(Answer("req_n", True, data={"pin": "1234"}), NOW)
        with anyio.fail_after(LIMIT):
            await heard.receive()
        stop()
        later: list[StoreEvent] = []
        await other.listen(later.append)
        await writer.save(case.halted)
        await writer.accept(Answer(case.ids[0], True), NOW)
        with anyio.fail_after(LIMIT):
            while not later:  # the listener still registered hears it; the stopped one not
                await anyio.lowlevel.checkpoint()
    assert seen == [
        StoreEvent("requested", "req_n", "run_n", "A"),
        StoreEvent("answered", "req_n", "run_n", "A"),
    ]  # and none after stop()
    assert "SECRET" not in repr(seen) and "1234" not in repr(seen)


async def test_a_schema_not_ours_or_newer_is_refused_and_not_touched(pg_dsn: str):
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("CREATE SCHEMA theirs; CREATE TABLE theirs.runs (x int)")
        with pytest.raises(StoreError, match="another application"):
            async with PostgresRunStore(pg_dsn, schema="theirs"):
                pass
        assert await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'theirs'"
        ) == [("runs",)]
        async with PostgresRunStore(pg_dsn, schema="ours"):
            pass
        await conn.execute("UPDATE ours.meta SET value = '99' WHERE key = 'version'")
        with pytest.raises(StoreError, match="newer release"):
            async with PostgresRunStore(pg_dsn, schema="ours"):
                pass
    finally:
        await conn.close()
    with pytest.raises(UsageError, match="identifier"):
        PostgresRunStore(pg_dsn, schema="ours; DROP TABLE x")


async def test_a_version_2_schema_gains_the_mcp_tokens_table(pg_dsn: str, case: Case):
    """Version 3 added ``mcp_tokens`` (the sign-in state of remote MCP servers), nothing else."""
    async with PostgresRunStore(pg_dsn, schema="older") as store:
        await store.save(case.halted)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("DROP TABLE older.mcp_tokens")
        await conn.execute("DROP TABLE older.answers")  # version 4's
        await conn.execute("DROP FUNCTION older.answers_append_only()")
        await conn.execute("ALTER TABLE older.requests DROP COLUMN raised_at")  # version 5's
        await conn.execute("UPDATE older.meta SET value = '2' WHERE key = 'version'")
        async with PostgresRunStore(pg_dsn, schema="older") as store:
            assert [r.id for r in await store.requests()] == case.ids
            await store.set_mcp_token("k", '{"a": 1}')
            await store.set_mcp_token("k", '{"a": 2}')
            assert await store.mcp_token("k") == '{"a": 2}'
            await store.set_mcp_token("k", None)
            assert await store.mcp_token("k") is None
        version = await conn.fetchval("SELECT value FROM older.meta WHERE key = 'version'")
        assert version == str(SCHEMA_VERSION)
    finally:
        await conn.close()


async def test_a_corrupt_run_fails_alone_naming_it(pg_dsn: str, case: Case):
    async with PostgresRunStore(pg_dsn) as store:
        await store.save(case.halted)
        await store.start(fresh_state("run_ok"), "A", NOW + LEASE)
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(
                "UPDATE toolnexus.runs SET state = '{not json' WHERE run_id = $1",
                case.halted.run_id,
            )
        finally:
            await conn.close()
        with pytest.raises(StoreError, match=rf"'{case.halted.run_id}'.*cannot be read"):
            await store.load(case.halted.run_id)
        assert (await store.load("run_ok")).status == "running"
        assert len(await store.requests()) == 2  # listing reads requests, not the run


async def test_the_password_never_shows(pg_dsn: str):
    host_part = pg_dsn.split("@", 1)[1]
    port = int(host_part.split("/", 1)[0].rsplit(":", 1)[1])
    wrong = f"postgresql://postgres:hunter2-secret@127.0.0.1:{port}/no_such_db?password=qs-secret"
    store = PostgresRunStore(wrong)
    assert "hunter2" not in repr(store) and "qs-secret" not in repr(store)
    with pytest.raises(StoreError) as caught:
        await store.requests()
    message = str(caught.value)
    assert "hunter2" not in message and "qs-secret" not in message
    assert f"postgresql 127.0.0.1:{port}/no_such_db" in message  # the user name is no secret
    assert "[redacted]" not in message.split(":", 1)[0]
    await store.aclose()
    with pytest.raises(UsageError, match="postgresql://"):
        PostgresRunStore("/var/lib/runs.sqlite")


async def test_schema_creation_by_many_workers_at_once_happens_once(pg_dsn: str):
    stores = [PostgresRunStore(pg_dsn) for _ in range(5)]
    try:
        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(store.requests)
    finally:
        for store in stores:
            await store.aclose()
    conn = await asyncpg.connect(pg_dsn)
    try:
        meta = await conn.fetch("SELECT key, value FROM toolnexus.meta ORDER BY key")
    finally:
        await conn.close()
    assert [tuple(row) for row in meta] == [
        ("application", "toolnexus_async run store"),
        ("version", str(SCHEMA_VERSION)),
    ]


async def test_a_burst_beyond_the_pool_queues_for_it_and_does_not_fail(pg_dsn: str):
    """More writes at once than connections: each waits its turn, however long the queue
    (``command_timeout`` bounds a statement, not the wait for a connection)."""
    async with PostgresRunStore(pg_dsn, min_size=1, max_size=1, command_timeout=0.2) as store:
        with anyio.fail_after(LIMIT * 3):
            async with anyio.create_task_group() as tg:
                for n in range(300):
                    tg.start_soon(store.start, fresh_state(f"run_{n}"), "A", NOW + LEASE)
        assert len(await store.runs(limit=1000)) == 300


async def test_aclose_lets_the_calls_made_before_it_finish(pg_dsn: str):
    """Writes waiting for the one pooled connection when aclose() is called: each commits
    (none is refused as the pool closes, nor loses its connection mid-transaction), and a
    call after aclose() is refused."""
    store = PostgresRunStore(pg_dsn, min_size=1, max_size=1)
    await store.runs()  # the pool is open
    failed: list[BaseException] = []

    async def start(n: int) -> None:
        try:
            await store.start(fresh_state(f"run_{n}"), "A", NOW + LEASE)
        except Exception as exc:
            failed.append(exc)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(start, n)
            await anyio.wait_all_tasks_blocked()  # each write is under way
            await store.aclose()
    assert failed == []
    with pytest.raises(UsageError, match="closed"):
        await store.start(fresh_state("run_late"), "A", NOW + LEASE)
    async with PostgresRunStore(pg_dsn) as again:
        assert len(await again.runs()) == 5


async def test_the_store_never_has_a_statement_jit_compiled(pg_dsn: str):
    """PostgreSQL's JIT compiled a listing's counts (estimated costly over a table not yet
    analysed) in 15-20 ms, for under 1 ms of work: ``GET /runs`` over 1,000 runs took 40-80
    ms, 6 without. The store's sessions have it off, whatever the database says."""
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(
            "DO $$ BEGIN EXECUTE format("
            "'ALTER DATABASE %I SET jit = on', current_database()); END $$"
        )
    finally:
        await admin.close()

    async def jit(conn: asyncpg.Connection) -> str:
        return str(await conn.fetchval("SHOW jit"))

    async with PostgresRunStore(pg_dsn) as store:
        assert await store._in_transaction(jit) == "off"
