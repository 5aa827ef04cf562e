"""The stores' events and listings (issue 34): kept with each change, read in commit order,
and an existing database migrated to them (SQLite 2 -> 3, PostgreSQL 1 -> 2), and on to
the current version (the MCP sign-in table, SQLite 4 and PostgreSQL 3) in the same opening."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg

from tests.shared import Ledger
from tests.test_store import halt
from toolnexus_async.durable import PostgresRunStore, SqliteRunStore
from toolnexus_async.durable._listing import RequestQuery, RunQuery
from toolnexus_async.durable._run_events import EventRead, EventTail, StoredEvent
from toolnexus_async.durable.postgres._schema import SCHEMA_VERSION as PG_VERSION
from toolnexus_async.durable.sqlite._schema import SCHEMA_VERSION as SQLITE_VERSION

NEW_COLUMNS = {
    "runs": ("outcome", "text"),
    "requests": ("kind", "prompt", "answered_at", "answered_by", "raised_at"),
}


def events(*seqs: int) -> tuple[StoredEvent, ...]:
    return tuple(StoredEvent(seq, "run", "tick", "{}") for seq in seqs)


def test_the_tail_waits_for_a_seq_a_running_transaction_may_hold_and_skips_a_dead_one():
    tail = EventTail(0)
    assert [e.seq for e in tail.take(EventRead(events(1, 2, 4), frozenset({7, 9})))] == [1, 2]
    # 3 is missing while 7 (which may hold it) still runs; 9 ended meanwhile.
    assert tail.take(EventRead(events(4, 5), frozenset({7, 8}))) == []
    assert [e.seq for e in tail.take(EventRead(events(3, 4, 5), frozenset({8})))] == [3, 4, 5]
    # 6 never comes: once no transaction that ran when it was missed runs any more, it is
    # skipped (its transaction rolled back).
    assert tail.take(EventRead(events(7), frozenset({10}))) == []
    assert [e.seq for e in tail.take(EventRead(events(7), frozenset({11})))] == [7]
    # Without any transaction in progress (SQLite: always), a gap is a rollback's.
    assert [e.seq for e in tail.take(EventRead(events(9, 10)))] == [9, 10]
    assert tail.after == 10


async def test_a_version_2_sqlite_file_is_migrated_to_listings_and_events(tmp_path: Path):
    path = tmp_path / "runs.db"
    ledger = Ledger()
    async with SqliteRunStore(path) as store:
        await store.save(await halt(ledger.toolkit()))
    # As a version 2 file was: no listing columns, no events.
    with sqlite3.connect(path) as db:
        for table, columns in NEW_COLUMNS.items():
            for column in columns:
                db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("DROP TABLE events")
        db.execute("DROP TABLE mcp_tokens")  # version 4's
        db.execute("DROP TABLE answers")  # version 5's
        db.execute("PRAGMA user_version = 2")
    db.close()
    async with SqliteRunStore(path) as store:
        page = await store.list_requests(RequestQuery(kinds=("approval",)))
        assert (page.total, page.counts) == (1, {"approval": 1, "input": 1})
        assert (await store.list_runs(RunQuery())).counts == {"pending": 1}
        assert await store.event_bounds() == (0, 0)
        await store.set_mcp_token("k", '{"a": 1}')
        assert await store.mcp_token("k") == '{"a": 1}'
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SQLITE_VERSION,)
    db.close()


async def test_a_version_1_postgres_schema_is_migrated_to_listings_and_events(pg_dsn: str):
    ledger = Ledger()
    async with PostgresRunStore(pg_dsn) as store:
        await store.save(await halt(ledger.toolkit()))
    conn = await asyncpg.connect(pg_dsn)
    try:
        for table, columns in NEW_COLUMNS.items():
            drops = ", ".join(f"DROP COLUMN {column}" for column in columns)
            await conn.execute(f"ALTER TABLE toolnexus.{table} {drops}")
        await conn.execute("DROP TABLE toolnexus.events")
        await conn.execute("DROP TABLE toolnexus.mcp_tokens")  # version 3's
        await conn.execute("DROP TABLE toolnexus.answers")  # version 4's
        await conn.execute("DROP FUNCTION toolnexus.answers_append_only()")
        await conn.execute("UPDATE toolnexus.meta SET value = '1' WHERE key = 'version'")
    finally:
        await conn.close()
    async with PostgresRunStore(pg_dsn) as store:
        page = await store.list_requests(RequestQuery(text="pay 30"))
        assert [s.request.kind for s in page.requests] == ["approval"]
        assert (await store.list_runs(RunQuery(statuses=("pending",)))).total == 1
        assert await store.event_bounds() == (0, 0)
        await store.set_mcp_token("k", '{"a": 1}')
        assert await store.mcp_token("k") == '{"a": 1}'
    conn = await asyncpg.connect(pg_dsn)
    try:
        version = await conn.fetchval("SELECT value FROM toolnexus.meta WHERE key = 'version'")
    finally:
        await conn.close()
    assert version == str(PG_VERSION)
