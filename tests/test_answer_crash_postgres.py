"""The audit row at the worst moment, on PostgreSQL: the database stops while the answer and
its audit row are written but not committed.

PostgreSQL, the server stopped: ``serve`` (in this process) takes the answer while a
trigger the test adds to its database's ``answers`` table holds the audit row's insert on
an advisory lock the test holds; the cluster is then killed (``pg_ctl stop -m immediate``).
The answer is refused with 503, nothing of it is kept, and once the cluster is started
again the same answer is taken (200) and the run ends.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import asyncpg

from tests.conftest import assert_no_leaks
from tests.pg import PgCluster
from tests.test_answer_crash import LIMIT, pay, pay_model
from tests.test_serve_api import closing, events, post, serving
from toolnexus_async import LlmClient, Toolkit
from toolnexus_async.durable import PostgresRunStore
from toolnexus_async.serve import create_app

# Holds every insert into the audit trail, once it is made, until the test lets go of the
# advisory lock: the answer's transaction is then written and not committed.
HOLD = """
CREATE FUNCTION public.hold_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(4242);
    RETURN NEW;
END $$;
CREATE TRIGGER hold_audit_row AFTER INSERT ON toolnexus.answers
    FOR EACH ROW EXECUTE FUNCTION public.hold_audit_row();
"""


async def waiting_on_the_hold(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
        )
    finally:
        await conn.close()


async def test_postgres_stopped_while_the_audit_row_is_written_refuses_the_answer(
    pg_cluster: PgCluster,
) -> None:
    admin = await asyncpg.connect(pg_cluster.server.dsn)
    try:
        await admin.execute("CREATE DATABASE app TEMPLATE template0")
    finally:
        await admin.close()
    dsn = pg_cluster.server.dsn_for("app")
    store = PostgresRunStore(dsn, command_timeout=5, call_timeout=5)
    token = "serve-tests-token-0123456789"
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit:
            # The store is closed with the app (serving checks for leaks once it stopped).
            app = closing(
                create_app(
                    make_client=lambda inbox: LlmClient.in_process(pay_model, wait_for=inbox),
                    toolkit=toolkit,
                    store=store,
                    token=token,
                    park_timeout=600,
                    store_timeout=5,
                ),
                store,
            )
            async with serving(app, headers={"Authorization": f"Bearer {token}"}) as http:
                async with events(http) as stream:
                    status, started = await post(http, "/runs", {"prompt": "pay the invoice"})
                    assert status == 202
                    run_id = started["id"]
                    pending = await stream.until("pending", run_id=run_id)
                request_id = pending["request"]["id"]
                answer_path = f"/requests/{request_id}/answer"

                holder = await asyncpg.connect(dsn)
                await holder.execute(HOLD)
                await holder.execute("SELECT pg_advisory_lock(4242)")
                replies: list[tuple[int, Any, Any]] = []

                async def answer() -> None:
                    async with http.post(answer_path, json={"ok": True}) as reply:
                        replies.append((reply.status, await reply.json(), reply.headers))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(answer)
                    # The answer's transaction has inserted the audit row and waits.
                    while not await waiting_on_the_hold(dsn):
                        await anyio.lowlevel.checkpoint()
                    await anyio.to_thread.run_sync(pg_cluster.crash)
                ((status, body, headers),) = replies
                assert status == 503, body
                assert "the run store is unavailable" in body["error"]
                assert int(headers["Retry-After"]) >= 1
                await holder.close()

                await anyio.to_thread.run_sync(pg_cluster.start)
                conn = await asyncpg.connect(dsn)
                try:
                    # Nothing half-written: the request waits, the trail is empty.
                    assert (
                        await conn.fetchval(
                            "SELECT status FROM toolnexus.requests WHERE request_id = $1",
                            request_id,
                        )
                        == "pending"
                    )
                    assert await conn.fetchval("SELECT count(*) FROM toolnexus.answers") == 0
                    await conn.execute("DROP TRIGGER hold_audit_row ON toolnexus.answers")
                finally:
                    await conn.close()

                # The same answer again, once the store is back: taken, and the run ends.
                async with events(http) as stream:
                    while True:
                        async with http.post(answer_path, json={"ok": True}) as reply:
                            if reply.status != 503:
                                assert reply.status == 200, await reply.text()
                                break
                    done = await stream.until("done", run_id=run_id)
                assert done["text"] == "paid 30"
            conn = await asyncpg.connect(dsn)
            try:
                rows = await conn.fetch(
                    "SELECT outcome, answered_by FROM toolnexus.answers WHERE request_id = $1",
                    request_id,
                )
            finally:
                await conn.close()
    assert [(r["outcome"], r["answered_by"]) for r in rows] == [("approved", "api")]
    assert_no_leaks()
