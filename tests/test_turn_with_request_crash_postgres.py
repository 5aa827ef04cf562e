"""A turn written with its gate's request on PostgreSQL, and the worker (or the worker and
its database) gone at the worst moment.

A child process (the script below) runs a durable host over a PostgreSQL store, begins a
run (``serve``'s way) and drives it: the model asks for ``pay``, its ``require_approval``
gate asks, and the turn and the request are written in one statement of one transaction
(``_asked``). The child's group commit is wrapped to stop its event loop, so that nothing
of the process goes on, at one of two points of the transaction that writes that turn
(found by its write, not by its statement: a turn's write, with its request or not):

- ``commit``: every statement of the transaction ran (the request's NOTIFY too), its
  ``COMMIT`` was not sent;
- ``after``: it committed, and no caller was told.

Stopped there, the child is SIGKILLed (``sigkill``), or the cluster is killed
(``pg_ctl stop -m immediate``), then the child, and the cluster started again, recovering
from its WAL (``crash``: the machine's power lost). A new host on the database (as after
a restart) goes on with the run once the dead worker's lease ran out:

- before the commit, the database has the run as it started and no request: the run asks
  the model again from there, its gate asks again, and only that request is ever listed;
  answered, the run ends and ``pay`` ran once;
- after it, the request is listed before any host runs, and answering it ends the run
  without asking the model for the turn again.

Were the turn and its request two transactions, the ``after`` point would be between
them, and the database would have the turn without its request.

The same on SQLite: ``tests/test_turn_with_request_crash.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import asyncpg
import pytest

from tests.conftest import assert_no_leaks
from tests.pg import PgCluster
from tests.test_answer_crash import killed_after
from tests.test_pg_faults import database
from tests.test_turn_with_request_crash import WORKER, taken_over
from toolnexus_async.durable import PostgresRunStore

LIMIT = 90  # each child is a fresh interpreter; a crashed cluster starts again

CHILD = (
    """
import sys, threading

import anyio

from toolnexus_async import Hooks, LlmClient, Toolkit, ToolReturn, define_tool, require_approval
from toolnexus_async.durable import DurableHost, PostgresRunStore
from toolnexus_async.durable.postgres import _committer
from toolnexus_async.durable.postgres._asked import Asked
from toolnexus_async.durable.postgres._pool import PgConnections
from toolnexus_async.durable.postgres._run_ops import PgRunOps
from toolnexus_async.testing import reply, tool_call

POINT, DSN, EFFECTS = sys.argv[1:4]  # POINT: "commit" or "after"
TURNS = (PgRunOps.turn, Asked.turn)  # a turn's write, alone or with its request
armed = False


"""
    + WORKER
    + '''

def turned(batch):
    """Whether a batch writes a run's turn (the start writes turn 0)."""
    return any(getattr(op, "__func__", None) in TURNS and args[1] > 0 for op, args, *_ in batch)


def stop(point, batch):
    say("WRITES " + " ".join(op.__qualname__ for op, *_ in batch))
    say("PAUSED " + point)
    threading.Event().wait()  # the event loop with it, until the SIGKILL


apply = _committer._apply


async def applied(conn, batch, *rest):
    outcomes = await apply(conn, batch, *rest)
    if armed and POINT == "commit" and turned(batch):
        stop("commit", batch)  # every statement ran in the transaction, not its COMMIT
    return outcomes


in_transaction = PgConnections.in_transaction


async def committed(self, op, *args):
    outcome = await in_transaction(self, op, *args)
    if armed and POINT == "after" and op is applied and turned(args[0]):
        stop("after", args[0])  # committed, and nobody told
    return outcome


_committer._apply = applied
PgConnections.in_transaction = committed


async def main():
    global armed
    gate = Hooks(before_tool=require_approval(["pay"]))
    async with (
        PostgresRunStore(DSN) as store,
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model, hooks=gate) as client,
        DurableHost(client, toolkit, store, lease=1.0, sweep=0.05) as host,
    ):
        begun = await host.begin("pay the invoice")
        say("BEGUN " + begun.run_id)
        armed = True
        await begun.run()
        say("NOT PAUSED")


anyio.run(main)
'''
)


async def fetch(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(row) for row in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


@pytest.mark.parametrize("how", ["sigkill", "crash"])
@pytest.mark.parametrize("point", ["commit", "after"])
async def test_worker_gone_at_the_turn_written_with_its_request_on_postgres(
    tmp_path: Path, pg_cluster: PgCluster, point: str, how: str
) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    dsn = await database(pg_cluster)
    effects_file = tmp_path / "effects.txt"

    async def crash() -> None:  # the database first, while the child holds its transaction
        if how == "crash":
            await anyio.to_thread.run_sync(pg_cluster.crash)

    command = [sys.executable, str(tmp_path / "child.py"), point, dsn, str(effects_file)]
    with anyio.fail_after(LIMIT):
        lines, _ = await killed_after(
            command, lambda line: line.startswith("PAUSED") or line == "NOT PAUSED", crash
        )
        if how == "crash":
            await anyio.to_thread.run_sync(pg_cluster.start)
    assert lines[-1] == f"PAUSED {point}", lines
    assert lines[-2] == "WRITES Asked.turn"  # the turn and its request: one statement
    run_id = lines[0].removeprefix("BEGUN ")
    assert effects_file.read_text().split() == ["model"]  # asked once, paid nothing

    turn = await fetch(dsn, "SELECT turn FROM toolnexus.runs WHERE run_id = $1", run_id)
    asked = await fetch(dsn, "SELECT request_id, status FROM toolnexus.requests")
    if point == "commit":
        assert (turn, asked) == ([(0,)], [])  # neither the turn nor the request
    else:
        assert turn == [(1,)] and [status for _, status in asked] == ["pending"]

    with anyio.fail_after(LIMIT):
        async with PostgresRunStore(dsn) as store:
            await taken_over(store, point, asked)
    # Only one request was ever written.
    assert len(await fetch(dsn, "SELECT request_id FROM toolnexus.requests")) == 1
    assert_no_leaks()
