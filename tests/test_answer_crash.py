"""The audit row at the worst moment: the process taking an answer dies, or its database
does, while the answer and its audit row are written but not committed.

SQLite, a real SIGKILL: a child process (the script below) runs a durable host over a
SQLite file with a run halted on its approval, and takes the answer. Its store's connection
has a trace callback (``sqlite3.Connection.set_trace_callback``, called as each statement
starts) that pauses the writing thread at a chosen statement: the ``COMMIT`` that follows
the audit row's ``INSERT INTO answers`` (right after the insert, before the commit), or the
n-th statement of a write transaction after the answer was given (the answer's, then the
claim of its run), for every n until the answer is acknowledged. Paused, the child is
SIGKILLed; the file then holds the answer and its audit row both or neither, nothing was
acknowledged (the child prints ``ACK`` only once ``host.answer`` returned), and a new host
on the file (here, as after a restart) given the answer again takes it (or, when both were
committed, is told it was answered already) and the run ends paid.

The same at PostgreSQL, the server stopped: ``tests/test_answer_crash_postgres.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    AssistantMessage,
    LlmClient,
    Message,
    Request,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)
from toolnexus_async.durable import DurableHost, SqliteRunStore

LIMIT = 60  # each child is a fresh interpreter

CHILD = '''
import json, os, sys, threading

import anyio

from toolnexus_async import (
    Answer, LlmClient, Request, ToolContext, Toolkit, ToolResult,
    ToolReturn, define_tool,
)
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.durable.sqlite._file import RunFile
from toolnexus_async.testing import reply, tool_call

MODE, DB, EFFECTS = sys.argv[1:4]  # MODE: halt, or answer (pausing at POINT)
POINT = sys.argv[4] if MODE == "answer" else ""


def say(line):
    sys.stdout.write(line + "\\n")
    sys.stdout.flush()


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    with open(EFFECTS, "a") as f:
        f.write(f"{os.getpid()} paid {amount} {ctx.idempotency_key}\\n")
    return ToolResult.ok(f"paid {amount}")


def model(messages, tools):
    if isinstance(messages[-1], ToolReturn):
        return messages[-1].output
    return reply(None, tool_call("pay", {"amount": 30}, id="c1"))


class PausingFile(RunFile):
    """Pauses the store's thread at POINT, once armed: "audit" is the COMMIT after the
    audit row's insert; a number n, the n-th statement of a write transaction (from its
    BEGIN IMMEDIATE to its COMMIT) after arming. Reads are not counted: a host's sweep
    may or may not read in between."""

    armed = False
    writing = False
    seen = 0
    last = ""

    def _connect(self):
        conn = super()._connect()
        conn.set_trace_callback(self._traced)
        return conn

    def _traced(self, sql):
        if not self.armed:
            return
        if sql == "BEGIN IMMEDIATE":
            PausingFile.writing = True
        if not PausingFile.writing:
            return
        if sql in ("COMMIT", "ROLLBACK"):
            PausingFile.writing = False
        PausingFile.seen += 1
        before, PausingFile.last = PausingFile.last, sql
        if POINT == "audit":
            hit = sql == "COMMIT" and before.startswith("INSERT INTO answers")
        else:
            hit = PausingFile.seen == int(POINT)
        if hit:
            say("PAUSED " + json.dumps({"sql": sql, "before": before}))
            threading.Event().wait()  # until the SIGKILL


class Pausing(SqliteRunStore):
    _file_class = PausingFile


async def main():
    ended = anyio.Event()
    results = []

    def on_result(result):
        results.append(result)
        ended.set()

    store = Pausing(DB) if MODE == "answer" else SqliteRunStore(DB)
    async with (
        store,
        Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
        LlmClient.in_process(model) as client,
        DurableHost(client, toolkit, store, on_result=on_result, lease=1.0) as host,
    ):
        if MODE == "halt":
            halted = await host.run("pay the invoice")
            say(json.dumps({"run_id": halted.run_id, "request_id": halted.pending.id}))
            return
        PausingFile.armed = True
        await host.answer(Answer(sys.argv[-1], True), answered_by="user:alice")
        say("ACK")  # host.answer returned: acknowledged
        await ended.wait()
        say("DONE " + results[0].text)


anyio.run(main)
'''


def pay_model(messages: list[Message], tools: Any) -> AssistantMessage | str:
    done = [m for m in messages if isinstance(m, ToolReturn)]
    if not done:
        assert any(isinstance(m, UserMessage) for m in messages)
        return AssistantMessage(None, (ToolCall("c1", "pay", {"amount": 30}),))
    return done[-1].output


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    return ToolResult.ok(f"paid {amount}")


def env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


async def child(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """Run the child to its end: exit status, stdout, stderr."""
    with anyio.fail_after(LIMIT):
        done = await anyio.run_process(
            [sys.executable, str(tmp_path / "child.py"), *args], env=env(), check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def killed_after(
    command: list[str],
    last: Callable[[str], bool],
    before: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[str], str]:
    """Run the child ``command`` until a line of its stdout is ``last``, then SIGKILL it
    (paused, or gone on past what was watched for: killed either way), once ``before()``
    (if given) returned. The lines up to that one, and whatever it had written after."""
    with anyio.fail_after(LIMIT):
        async with await anyio.open_process(command, env=env()) as process:
            assert process.stdout is not None
            out = BufferedByteReceiveStream(process.stdout)
            lines: list[str] = []
            try:
                while not lines or not last(lines[-1]):
                    lines.append((await out.receive_until(b"\n", 65536)).decode())
                if before is not None:
                    await before()
                process.send_signal(signal.SIGKILL)
                rest = b"".join([chunk async for chunk in process.stdout]).decode()
                assert await process.wait() == -signal.SIGKILL
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    return lines, rest


async def answer_until_paused(
    tmp_path: Path, db: Path, point: str, request_id: str
) -> tuple[str, dict[str, str] | None]:
    """Start the answering child; once it pauses, SIGKILL it. Its whole stdout, and what it
    paused at (``None``: it acknowledged the answer before reaching ``point``)."""
    effects = str(tmp_path / "effects.txt")
    command = [sys.executable, str(tmp_path / "child.py"), "answer", str(db), effects, point]
    lines, rest = await killed_after(
        [*command, request_id], lambda line: line.startswith("PAUSED ") or line == "ACK"
    )
    out = "\n".join(lines) + "\n" + rest
    if lines[-1] == "ACK":
        return out, None
    return out, json.loads(lines[-1].removeprefix("PAUSED "))


def kept(db: Path, request_id: str) -> tuple[str, list[tuple[str, str | None]]]:
    """The request's status and its audit rows, read from the file as a new process would
    (opening it recovers the WAL)."""
    conn = sqlite3.connect(db)
    try:
        (status,) = conn.execute(
            "SELECT status FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
        rows = conn.execute(
            "SELECT outcome, detail FROM answers WHERE request_id = ? ORDER BY seq",
            (request_id,),
        ).fetchall()
    finally:
        conn.close()
    return status, [(outcome, detail) for outcome, detail in rows]


async def again(db: Path, request_id: str) -> tuple[str, str]:
    """After the restart (in this process): the same answer given again through a new host
    on the file; whether it was taken now or answered already, and the run's final text."""
    ended = anyio.Event()
    results: list[Any] = []

    def on_result(result: Any) -> None:
        results.append(result)
        ended.set()

    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(db) as store,
            Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
            LlmClient.in_process(pay_model) as client,
            DurableHost(client, toolkit, store, on_result=on_result, sweep=0.05) as host,
        ):
            try:
                await host.answer(Answer(request_id, True), answered_by="user:alice")
            except AlreadyAnsweredError:
                taken = "already"
            else:
                taken = "now"
            await ended.wait()  # the dead worker's lease (1 s) runs out, then the run goes on
    return taken, results[0].text


async def test_sigkill_while_the_answer_and_its_audit_row_are_written_keeps_both_or_neither(
    tmp_path: Path,
) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    halted_db = tmp_path / "halted.db"
    code, out, err = await child(tmp_path, "halt", str(halted_db), str(tmp_path / "none.txt"))
    assert code == 0, err
    request_id = json.loads(out.splitlines()[-1])["request_id"]
    assert not Path(f"{halted_db}-wal").exists()  # closed cleanly: one file to copy

    outcomes: list[tuple[str, str, str]] = []
    for n in range(41):  # the answer and the claim that follows it: a handful of statements
        point = "audit" if n == 0 else str(n)
        db = tmp_path / f"at-{point}.db"
        shutil.copyfile(halted_db, db)
        output, paused = await answer_until_paused(tmp_path, db, point, request_id)
        status, rows = kept(db, request_id)
        if paused is None:
            # Acknowledged: the answer and its row were committed before.
            assert (status, rows) == ("answered", [("approved", None)]), output
        else:
            assert "ACK" not in output.splitlines(), output  # nothing acknowledged
            # Both or neither.
            both = ("answered", [("approved", None)])
            assert (status, rows) in (("pending", []), both), (point, paused, status, rows)
        if point == "audit":
            assert paused is not None and paused["sql"] == "COMMIT"
            assert paused["before"].startswith("INSERT INTO answers")
            assert (status, rows) == ("pending", [])  # written, never committed
        # After the restart the answer is given again: taken now, or answered already.
        taken, text = await again(db, request_id)
        assert taken == ("now" if status == "pending" else "already")
        assert text == "paid 30"
        after, rows_after = kept(db, request_id)
        assert after == "answered"
        assert rows_after[0] == ("approved", None)
        assert rows_after[1:] == ([] if taken == "now" else [("refused", "already_answered")])
        outcomes.append((point, "ACK" if paused is None else paused["sql"][:20], status))
        if paused is None:
            break
    else:
        raise AssertionError(f"never acknowledged: {outcomes}")
    # Killed before the answer's commit, and after it before the acknowledgement.
    assert {status for _, sql, status in outcomes if sql != "ACK"} == {"pending", "answered"}
    assert_no_leaks()
