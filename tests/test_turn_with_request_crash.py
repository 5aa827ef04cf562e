"""A turn written with its gate's request, and the worker SIGKILLed at the worst moment.

A child process (the script below) runs a durable host over a SQLite file, begins a run
(``serve``'s way) and drives it: the model asks for ``pay``, its ``require_approval`` gate
asks, and the turn and the request are written in one transaction. The store's connection
has a trace callback (called as each statement starts) that pauses the writing thread
either at that transaction's ``COMMIT`` (written, not committed) or at the first statement
after it (committed; the request may or may not have been announced in the child). Paused,
the child is SIGKILLed, and a new host on the file (as after a restart) goes on with the
run once the dead worker's lease ran out:

- killed before the commit, the file has the run as it started and no request: the run
  asks the model again from there, its gate asks again, and only that request is ever
  listed; answered, the run ends and ``pay`` ran once;
- killed after it, the request is listed before any host runs, and answering it ends the
  run without asking the model for the turn again.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from tests.test_answer_crash import killed_after
from tests.test_host import until
from tests.test_turn_with_request import GATE, pay_model, pay_toolkit
from toolnexus_async import Answer, Inbox, LlmClient, Message, RunResult
from toolnexus_async.durable import DurableHost, RunStore, SqliteRunStore

LIMIT = 60  # each child is a fresh interpreter

# The child's worker: what it says, what it did (in EFFECTS), its tool and its model.
WORKER = '''
def say(line):
    sys.stdout.write(line + "\\n")
    sys.stdout.flush()


def effect(line):
    with open(EFFECTS, "a") as f:
        f.write(line + "\\n")


@define_tool(name="pay")
async def pay() -> str:
    """Pay (the gate asks first)."""
    effect("paid")
    return "paid"


def model(messages, tools):
    effect("model")
    if isinstance(messages[-1], ToolReturn):
        return f"result: {messages[-1].output}"
    return reply(tool_call("pay", id="c1"))

'''

CHILD = (
    """
import sys, threading

import anyio

from toolnexus_async import Hooks, LlmClient, Toolkit, ToolReturn, define_tool, require_approval
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.durable.sqlite._file import RunFile
from toolnexus_async.testing import reply, tool_call

POINT, DB, EFFECTS = sys.argv[1:4]  # POINT: "commit" or "after"


"""
    + WORKER
    + '''

class PausingFile(RunFile):
    """Once armed, pauses the store's thread at the COMMIT of the transaction that writes
    a turn and a request ("commit"), or at the first statement after it ("after")."""

    armed = False
    current = None  # the statements of the write transaction under way
    committed = False

    def _connect(self):
        conn = super()._connect()
        conn.set_trace_callback(self._traced)
        return conn

    def _traced(self, sql):
        if not self.armed:
            return
        if PausingFile.committed:
            say("PAUSED after")
            threading.Event().wait()  # until the SIGKILL
        if sql == "BEGIN IMMEDIATE":
            PausingFile.current = []
        elif PausingFile.current is not None and sql != "COMMIT":
            PausingFile.current.append(sql.strip())
        elif sql == "COMMIT" and PausingFile.current is not None:
            done, PausingFile.current = PausingFile.current, None
            both = any(s.startswith("UPDATE runs SET turn") for s in done) and any(
                s.startswith("INSERT INTO requests") for s in done
            )
            if not both:
                return
            if POINT == "commit":
                say("PAUSED commit")
                threading.Event().wait()
            PausingFile.committed = True


class Pausing(SqliteRunStore):
    _file_class = PausingFile


async def main():
    gate = Hooks(before_tool=require_approval(["pay"]))
    async with (
        Pausing(DB) as store,
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model, hooks=gate) as client,
        DurableHost(client, toolkit, store, lease=1.0, sweep=0.05) as host,
    ):
        begun = await host.begin("pay the invoice")
        say("BEGUN " + begun.run_id)
        PausingFile.armed = True
        await begun.run()
        say("NOT PAUSED")


anyio.run(main)
'''
)


async def paused_child(tmp_path: Path, point: str, db: Path) -> tuple[str, list[str]]:
    """Run the child until it pauses at ``point``, SIGKILL it: its run id and stdout."""
    command = [sys.executable, str(tmp_path / "child.py"), point, str(db)]
    command.append(str(tmp_path / f"effects-{point}.txt"))
    lines, _ = await killed_after(
        command, lambda line: line.startswith("PAUSED") or line == "NOT PAUSED"
    )
    assert lines[-1] == f"PAUSED {point}", lines
    return lines[0].removeprefix("BEGUN "), lines


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Read from the file as a new process would (opening it recovers the WAL)."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def taken_over(store: RunStore, point: str, asked: list[tuple[Any, ...]]) -> None:
    """A new host on ``store`` goes on with the dead worker's run (``asked``: the requests
    the store had, as (id, status)) and answers its request; checks what it asked and
    paid, for a worker killed at ``point``."""
    asks: list[str] = []
    paid: list[str] = []

    def model(messages: list[Message], tools: list[Any]) -> Any:
        asks.append(type(messages[-1]).__name__)
        return pay_model(messages, tools)

    inbox = Inbox()
    results: list[RunResult] = []
    ended = anyio.Event()

    def on_result(result: RunResult) -> None:
        results.append(result)
        ended.set()

    async with (
        pay_toolkit(paid) as toolkit,
        LlmClient.in_process(model, wait_for=inbox, hooks=GATE) as client,
    ):
        listed = [r.id for r in await store.requests()]  # before any host goes on
        assert listed == [request_id for request_id, _ in asked]
        async with DurableHost(client, toolkit, store, sweep=0.05, on_result=on_result) as host:
            # The dead worker's lease (1 s) runs out, then this host goes on with it.
            await until(lambda: len(inbox) == 1)
            (request,) = inbox.pending()
            if point == "after":
                assert request.id == asked[0][0]  # the same request, asked once
            assert [r.id for r in await store.requests()] == [request.id]
            await host.answer(Answer(request.id, True))
            await ended.wait()
    assert results[0].text == "result: paid" and paid == ["paid"]
    # Before the commit, the run asked the model again for its turn; after, it did not.
    assert asks == (["UserMessage", "ToolReturn"] if point == "commit" else ["ToolReturn"])


@pytest.mark.parametrize("point", ["commit", "after"])
async def test_sigkill_at_the_turn_written_with_its_request(tmp_path: Path, point: str):
    (tmp_path / "child.py").write_text(CHILD)
    db = tmp_path / "runs.db"
    run_id, _ = await paused_child(tmp_path, point, db)
    effects = (tmp_path / f"effects-{point}.txt").read_text().split()
    assert effects == ["model"]  # the child asked the model once, and paid nothing
    turn = rows(db, f"SELECT turn FROM runs WHERE run_id = '{run_id}'")
    asked = rows(db, "SELECT request_id, status FROM requests")
    if point == "commit":
        assert (turn, asked) == ([(0,)], [])  # neither the turn nor the request
    else:
        assert turn == [(1,)] and [status for _, status in asked] == ["pending"]

    with anyio.fail_after(LIMIT):
        async with SqliteRunStore(db) as store:
            await taken_over(store, point, asked)
    assert len(rows(db, "SELECT request_id FROM requests")) == 1  # only one ever written
    assert_no_leaks()
