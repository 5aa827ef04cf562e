"""A store that cannot be reached says so with StoreUnavailableError, naming the server.

Against a real PostgreSQL (``tests/pg.py``): a database that is not there, a connection
the server ends under a call, a statement held up by a lock past the store's timeout; and
the errors that are no passing fault (a bad statement) stay plain ``StoreError``s.
"""

from __future__ import annotations

import socket

import anyio
import asyncpg
import pytest

from tests.test_store import LEASE, NOW, fresh_state
from toolnexus_async import StoreError, StoreUnavailableError
from toolnexus_async.durable import PostgresRunStore
from toolnexus_async.durable.postgres._errors import where


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_database_that_is_not_there_is_unavailable_not_broken():
    store = PostgresRunStore(f"postgresql://postgres:s3cret@127.0.0.1:{_closed_port()}/app")
    with pytest.raises(StoreUnavailableError) as caught:
        await store.ping()
    assert "127.0.0.1" in str(caught.value) and "s3cret" not in str(caught.value)
    assert caught.value.retry_after > 0
    await store.aclose()


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        ("postgresql://u:pw@db.example:6543/app", "postgresql db.example:6543/app"),
        (
            "postgresql://u@/app?host=/var/run/postgresql",
            "postgresql socket /var/run/postgresql/.s.PGSQL.5432 app",
        ),
        (
            "postgresql://u@%2Ftmp%2Fpg:5433/app",
            "postgresql socket /tmp/pg/.s.PGSQL.5433 app",
        ),
    ],
)
def test_messages_name_the_real_server(dsn: str, named: str):
    assert where(dsn) == named


async def test_a_connection_ended_by_the_server_is_a_passing_fault(pg_dsn: str):
    """Whether the pool notices the ended connection before the next call (and opens a new
    one) or the call meets it (asyncpg then raises one of several errors, some not even
    database errors), the caller sees a success or StoreUnavailableError, nothing else,
    and the store works again right after."""
    async with PostgresRunStore(pg_dsn, min_size=1, max_size=1) as store:
        admin = await asyncpg.connect(pg_dsn)
        faults = 0
        try:
            for _ in range(10):
                await store.ping()
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                try:
                    await store.ping()
                except StoreUnavailableError:
                    faults += 1
                await store.ping()  # the pool opened a new connection: the store is back
        finally:
            await admin.close()


async def test_a_lock_held_past_the_timeout_fails_within_it(pg_dsn: str):
    async with PostgresRunStore(pg_dsn, command_timeout=0.5) as store:
        await store.start(fresh_state("r1"), "w1", NOW + LEASE)
        admin = await asyncpg.connect(pg_dsn)
        try:
            async with admin.transaction():
                await admin.execute("LOCK TABLE toolnexus.runs IN ACCESS EXCLUSIVE MODE")
                with anyio.fail_after(5):  # the guard; the store gives up after 0.5 s
                    with pytest.raises(StoreUnavailableError) as caught:
                        await store.turn(fresh_state("r1"), 1, "w1")
        finally:
            await admin.close()
        assert "TimeoutError" in str(caught.value)
        await store.turn(fresh_state("r1"), 1, "w1")  # the lock is gone: it goes through


async def test_a_bad_statement_is_a_store_error_not_a_passing_fault(pg_dsn: str):
    async with PostgresRunStore(pg_dsn) as store:

        async def broken(conn: object) -> None:
            await conn.execute("SELECT no_such_column FROM toolnexus.runs")  # type: ignore[attr-defined]

        with pytest.raises(StoreError) as caught:
            await store._in_transaction(broken)
        assert not isinstance(caught.value, StoreUnavailableError)


async def test_one_deadline_covers_the_wait_for_a_connection_and_the_statements(pg_dsn: str):
    """The pool's one connection is held up by a lock; a second call, made half-way
    through the first, waits for the connection. It fails within about the store timeout
    from its start: the wait for the connection is taken from what its statements may
    take (the two added up to twice the timeout before)."""
    timeout = 1.0
    async with PostgresRunStore(
        pg_dsn, command_timeout=timeout, call_timeout=timeout, min_size=1, max_size=1
    ) as store:
        await store.start(fresh_state("r1"), "w1", NOW + LEASE)
        admin = await asyncpg.connect(pg_dsn)
        took: list[float] = []

        async def write() -> None:
            began = anyio.current_time()
            with pytest.raises(StoreUnavailableError):
                await store.turn(fresh_state("r1"), 1, "w1")
            took.append(anyio.current_time() - began)

        async def waits_on_the_lock() -> bool:
            waiting = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            return bool(waiting)

        try:
            async with admin.transaction():
                await admin.execute("LOCK TABLE toolnexus.runs IN ACCESS EXCLUSIVE MODE")
                with anyio.fail_after(10):  # the guard of a hang
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(write)
                        while not await waits_on_the_lock():
                            await anyio.lowlevel.checkpoint()
                        # Half-way through the first call's time (the scenario, not a
                        # synchronisation): the second gets the connection when the
                        # first gives up, with half its own time gone.
                        await anyio.sleep(timeout / 2)
                        tg.start_soon(write)
        finally:
            await admin.close()
    # Loose: only "about one timeout, not two" is asserted, not a speed.
    assert len(took) == 2 and max(took) < timeout * 1.3, took
