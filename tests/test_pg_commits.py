"""How many write transactions a durable run costs on PostgreSQL (issue 41).

Counted by the server, not by the store: the transaction ids assigned on the cluster while
the runs go (``pg_snapshot_xmax`` before and after). Every transaction that writes a row
or sends a NOTIFY gets one; reads get none. The runs are the ``serve`` path: ``begin``
(kept before it is acknowledged), the model asks for the tool, the tool asks for
approval, the answer is taken on the same worker, the tool runs, the run ends.

A run alone cannot share a transaction with another run: its count is its own writes
(start, turn, suspension, answer, and the tool's result with the end). Runs that go
together share their transactions (group commit), as ``serve`` under load does.
"""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg

from tests.test_host import LIMIT, Pay, model, until
from toolnexus_async import Answer, Inbox, LlmClient
from toolnexus_async.durable import DurableHost, PostgresRunStore


async def _next_xid(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
    finally:
        await conn.close()


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
        before = await _next_xid(dsn)
        for _ in range(runs // together):
            await _round(host, inbox, together)
        after = await _next_xid(dsn)
    return (after - before - 1) / runs  # less _next_xid's own connection (no xid: a read)


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
