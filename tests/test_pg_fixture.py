"""The PostgreSQL fixtures themselves: a real server, a new empty database for every test.

The store tests trust ``pg_dsn`` to hand each of them a clean database; these tests are
what fails first if it ever hands out a shared, dirty or unreachable one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.pg import PgServer

# The databases earlier tests here were given: a later one must get none of them again,
# and must find them dropped. Either order works, and each check holds on its own.
SEEN: list[str] = []


@pytest.fixture
async def left_open() -> AsyncIterator[list[Any]]:
    """Connections to keep open past ``pg_dsn``'s teardown (requested before it, so torn
    down after it): the drop must not wait for a test to close what it opened."""
    conns: list[Any] = []
    yield conns
    for conn in conns:
        conn.terminate()  # the server has already ended them; this frees the client side


@pytest.mark.parametrize("turn", [1, 2])
async def test_every_test_gets_a_new_empty_database(
    left_open: list[Any], pg_dsn: str, turn: int
) -> None:
    name = urlsplit(pg_dsn).path.lstrip("/")
    assert name not in SEEN
    conn = await asyncpg.connect(pg_dsn)
    left_open.append(conn)
    try:
        assert await conn.fetchval("SELECT current_database()") == name
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname NOT IN "
            "('pg_catalog', 'information_schema')"
        )
        assert tables == []
        left = await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname = ANY($1::text[])", SEEN
        )
        assert left == [], "a finished test's database was not dropped"
        # Leave a table behind (and the connection open), for the next turn not to see.
        await conn.execute("CREATE TABLE leftover (turn int)")
        await conn.execute("INSERT INTO leftover VALUES ($1)", turn)
    finally:
        SEEN.append(name)


async def test_the_database_is_usable(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("CREATE TABLE runs (id text PRIMARY KEY, body jsonb NOT NULL)")
        async with conn.transaction():
            await conn.executemany(
                "INSERT INTO runs VALUES ($1, $2::jsonb)", [("a", '{"n": 1}'), ("b", '{"n": 2}')]
            )
        rows = await conn.fetch("SELECT id, body->>'n' AS n FROM runs ORDER BY id")
        assert [(row["id"], row["n"]) for row in rows] == [("a", "1"), ("b", "2")]
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute("INSERT INTO runs VALUES ('a', '{}')")
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
    finally:
        await conn.close()


async def test_the_dsn_has_no_password_and_names_the_server(
    pg_dsn: str, pg_server: PgServer
) -> None:
    parts = urlsplit(pg_dsn)
    assert parts.scheme == "postgresql"
    assert parts.password is None
    assert ":" not in parts.netloc.partition("@")[0]
    assert parts.username == "postgres"
    assert (parts.hostname, parts.port) == ("127.0.0.1", pg_server.port)
    # The Unix socket reaches the same server, so either way of connecting is tested.
    conn = await asyncpg.connect(
        host=str(pg_server.socket_dir), port=pg_server.port, user="postgres", database="postgres"
    )
    try:
        assert await conn.fetchval("SELECT current_user") == "postgres"
    finally:
        await conn.close()
