"""The PostgreSQL store's database restarted under a live worker just as a ``COMMIT``
committed: its reply cut off, the worker told the write failed though it is kept.

The worker is this test's process (``tests/restart_alive.py``). The ``COMMIT`` of a
chosen write (a run's turn with its gate's request, an answer, a tool's result) is held
after it is written: the database has ``synchronous_standby_names`` set to a standby that
does not exist and ``synchronous_commit`` local, and that one transaction sets it on, so
its ``COMMIT`` waits for the standby (``SyncRep``) once it is in the WAL. The cluster is
restarted then (``-m fast``: the backend ends, saying the transaction committed locally;
``-m immediate``: recovered from the WAL). What must hold: a run's retry finds its write
done and the run goes on as if told (one request, the tool run once, its result told once
on the event feed); an answer's caller is refused (``StoreUnavailableError``), the answer
is kept and its run woken with it, and the same answer sent again is refused as answered
already.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import asyncpg
import pytest

from tests.pg import PgCluster
from tests.restart_alive import (
    LEASE,
    LIMIT,
    MODES,
    Batch,
    closed_clean,
    ended_once,
    restart,
    rows,
    turn_with_request,
    working,
    writes,
)
from tests.test_pg_faults import database
from tests.test_store import fresh_state, turn_state
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    ToolCallRecord,
    ToolResult,
)
from toolnexus_async.durable import PostgresRunStore
from toolnexus_async.durable.postgres import _committer
from toolnexus_async.durable.postgres._answer_ops import PgAnswerOps
from toolnexus_async.durable.postgres._run_ops import PgRunOps
from toolnexus_async.testing import tool_call


class Unreplied:
    """Once armed, the first transaction whose batch ``matches`` commits without a reply:
    its ``COMMIT`` waits for a synchronous standby that does not exist (the database has
    ``synchronous_standby_names`` set and ``synchronous_commit`` local, this transaction
    alone on), so it is in the WAL and the server stops before it answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, matches: Callable[[Batch], bool]) -> None:
        self.matches = matches
        self.armed = False
        apply = _committer._apply

        async def applied(conn: Any, batch: Batch, *rest: Any) -> Any:
            outcomes = await apply(conn, batch, *rest)
            if self.armed and self.matches(batch):
                self.armed = False
                await conn.execute("SET LOCAL synchronous_commit = on")
            return outcomes

        monkeypatch.setattr(_committer, "_apply", applied)

    def arm(self) -> None:
        self.armed = True

    @staticmethod
    async def prepare(cluster: PgCluster, dsn: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            # This session commits without a standby too: first, before there is one.
            await conn.execute("SET synchronous_commit = local")
            await conn.execute("ALTER DATABASE app SET synchronous_commit = local")
            await conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()

    @staticmethod
    async def waiting(dsn: str) -> None:
        """Until a COMMIT is written and waits for its standby."""
        while not await rows(dsn, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"):
            await anyio.lowlevel.checkpoint()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("write", ["turn", "answer", "result"])
async def test_database_restarted_after_a_commit_its_reply_cut_off(
    pg_cluster: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    write: str,
    mode: str,
) -> None:
    """Committed, and the restart cut its reply off: the worker is told the write failed
    (``StoreUnavailableError``) though the database has it. A run's retry is refused or
    finds it done, and the run goes on as if told; an answer's caller is refused (503),
    its answer kept and its run woken all the same."""
    dsn = await database(pg_cluster)
    with anyio.fail_after(LIMIT):
        await Unreplied.prepare(pg_cluster, dsn)
    matches = {
        "turn": turn_with_request,
        "answer": lambda batch: writes(batch, PgAnswerOps.accept),
        "result": lambda batch: writes(batch, PgRunOps.record),
    }[write]
    unreplied = Unreplied(monkeypatch, matches)
    with anyio.fail_after(LIMIT):
        async with working(dsn, command_timeout=30) as worker, anyio.create_task_group() as tg:
            if write == "turn":
                unreplied.arm()
            tg.start_soon(worker.drive)
            if write == "turn":
                await Unreplied.waiting(dsn)
                await restart(pg_cluster, mode)
            (request,) = await worker.parked()
            if write == "answer":
                unreplied.arm()
                async with anyio.create_task_group() as answering:
                    answering.start_soon(worker.answer, request)
                    await Unreplied.waiting(dsn)
                    await restart(pg_cluster, mode)
                assert len(worker.refused) == 1  # not told it was taken; it was all the same
                with pytest.raises(AlreadyAnsweredError):  # sent again: refused, told why
                    await worker.host.answer(Answer(request.id, True))
            else:
                if write == "result":
                    unreplied.arm()
                await worker.host.answer(Answer(request.id, True))
                if write == "result":
                    await Unreplied.waiting(dsn)
                    await restart(pg_cluster, mode)
            await ended_once(dsn, worker)
    assert not unreplied.armed
    # The tool's result was told once on the run's event feed.
    told = await rows(dsn, "SELECT kind FROM toolnexus.events ORDER BY seq")
    assert len([k for (k,) in told if k == "tool_result"]) == 1, told
    await closed_clean(dsn, caplog)


async def test_a_result_written_again_as_it_is_is_told_once(pg_dsn: str) -> None:
    """What a run's retry of a result whose reply was lost writes (the result as it is
    stored already) tells no second ``tool_result`` event: alone, and grouped with other
    runs' results in one statement. A result that differs is told again."""
    call = tool_call("pay", {"amount": 3}, id="c1")
    runs = ["run_0", "run_1", "run_2"]
    recorded = {run_id: ToolCallRecord(call, ToolResult.ok("paid 3"), 1) for run_id in runs}
    async with PostgresRunStore(pg_dsn) as store:
        for run_id in runs:
            await store.start(fresh_state(run_id), "A", time.time() + LEASE)
            await store.turn(turn_state(run_id, call), 1, "A")

        async def record_all() -> None:  # queued at once: one batch, one statement
            async with anyio.create_task_group() as tg:
                for run_id, record in recorded.items():
                    tg.start_soon(store.record, run_id, record, "A")

        await store.record("run_0", recorded["run_0"], "A")
        await store.record("run_0", recorded["run_0"], "A")  # alone, again
        await record_all()
        await record_all()  # grouped, again
        changed = ToolCallRecord(call, ToolResult.ok("paid 4"), 1)
        await store.record("run_1", changed, "A")
    told = await rows(
        pg_dsn,
        "SELECT run_id, count(*) FROM toolnexus.events WHERE kind = 'tool_result'"
        " GROUP BY run_id ORDER BY run_id",
    )
    assert told == [("run_0", 1), ("run_1", 2), ("run_2", 1)]
