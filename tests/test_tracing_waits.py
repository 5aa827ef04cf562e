"""A stored run's wait has its real duration in the trace, on SQLite and PostgreSQL.

A durable host halts a run on an approval and keeps it in the store; later a host (in this
process, or in a fresh interpreter: the child script below) takes the answer and resumes
the run from the store. The resumed run's ``wait approval`` span starts when the store was
told of the request (``requests.raised_at``) and ends when the store took the answer (the
audit record's ``at``), with ``toolnexus.wait.seconds`` between the two: asserted against
the times the store kept, not the clock. A store of the previous schema gains the column
when opened; a request it kept before has no known raise time, so its wait stays an
instant.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import assert_no_leaks
from toolnexus_async import Answer, Inbox, LlmClient, RunResult, Tracing
from toolnexus_async.durable import DurableHost, RunStore

LIMIT = 60  # a fresh interpreter imports aiohttp, asyncpg and OpenTelemetry

# The agent, the stores and the resume: run as a script by the child, exec'd here.
AGENT = '''
import json, sys

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolnexus_async import (
    Answer, LlmClient, Request, ToolContext, Toolkit, ToolResult, ToolReturn, Tracing,
    define_tool,
)
from toolnexus_async.durable import DurableHost, PostgresRunStore, SqliteRunStore
from toolnexus_async.testing import reply, tool_call


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    return ToolResult.ok(f"paid {amount}")


def toolkit():
    return Toolkit.create(builtins=False, extra_tools=[pay])


def model(messages, tools):
    if isinstance(messages[-1], ToolReturn):
        return messages[-1].output
    return reply(None, tool_call("pay", {"amount": 30}, id="c1"))


def open_store(kind, where):
    return SqliteRunStore(where) if kind == "sqlite" else PostgresRunStore(where)


def span_dict(s):
    return {
        "name": s.name,
        "trace_id": s.context.trace_id,
        "span_id": s.context.span_id,
        "parent": s.parent.span_id if s.parent else None,
        "start": s.start_time,
        "end": s.end_time,
        "attributes": dict(s.attributes),
    }


async def answer_and_resume(kind, where, request_id):
    """Answer ``request_id`` through a host of its own and wait for the resumed run's end:
    its text and its spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ended = anyio.Event()
    results = []

    def on_result(result):
        results.append(result)
        ended.set()

    tracing = Tracing(tracer_provider=provider)
    async with (
        open_store(kind, where) as store,
        LlmClient.in_process(model, tracing=tracing) as client,
        DurableHost(client, toolkit(), store, on_result=on_result, sweep=0.05, poll=0.05) as host,
    ):
        await host.answer(Answer(request_id, True), answered_by="user:alice")
        await ended.wait()
    provider.shutdown()
    return {"text": results[0].text, "spans": [span_dict(s) for s in exporter.get_finished_spans()]}


if __name__ == "__main__":
    out = anyio.run(answer_and_resume, *sys.argv[1:4])
    print(json.dumps(out), flush=True)
'''


def agent(where: Path) -> dict[str, Any]:
    (where / "agent.py").write_text(AGENT)
    namespace: dict[str, Any] = {"__name__": "agent_here"}
    exec(compile(AGENT, str(where / "agent.py"), "exec"), namespace)
    return namespace


@pytest.fixture(params=["sqlite", "postgres"])
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Which store, and where: a SQLite file, or a PostgreSQL database's DSN."""
    if request.param == "postgres":
        return "postgres", str(request.getfixturevalue("pg_dsn"))
    return "sqlite", str(tmp_path / "runs.db")


async def halt(
    ns: dict[str, Any], kind: str, where: str
) -> tuple[RunResult, InMemorySpanExporter, TracerProvider]:
    """A durable host's run halted on its approval (no wait_for), traced."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store: RunStore = ns["open_store"](kind, where)
    async with (
        store,
        LlmClient.in_process(ns["model"], tracing=Tracing(tracer_provider=provider)) as client,
        DurableHost(client, ns["toolkit"](), store) as host,
    ):
        halted = await host.run("pay the invoice")
    assert halted.status == "pending" and halted.pending is not None
    return halted, exporter, provider


async def stored_times(ns: dict[str, Any], kind: str, where: str, run_id: str) -> Any:
    async with ns["open_store"](kind, where) as store:
        return await store.load(run_id)


async def answered_at(ns: dict[str, Any], kind: str, where: str, run_id: str) -> float:
    async with ns["open_store"](kind, where) as store:
        (record,) = await store.answers(run_id)
    assert record.outcome == "approved" and record.answered_by == "user:alice"
    return float(record.at)


def check_wait(
    spans: list[dict[str, Any]], first: Any, raised: float, answered: float, request_id: str
) -> None:
    (resumed,) = [s for s in spans if s["name"] == "invoke_agent"]
    assert resumed["trace_id"] == first.context.trace_id
    assert resumed["parent"] == first.context.span_id
    (wait,) = [s for s in spans if s["name"] == "wait approval"]
    assert wait["parent"] == resumed["span_id"]
    assert wait["attributes"]["toolnexus.request.id"] == request_id
    assert wait["attributes"]["toolnexus.wait.outcome"] == "approved"
    assert wait["attributes"]["toolnexus.wait.resumed"] is True
    # The whole wait, as the store kept it: raised, then answered.
    assert wait["start"] == int(raised * 1e9)
    assert wait["end"] == int(answered * 1e9)
    seconds = wait["attributes"]["toolnexus.wait.seconds"]
    assert seconds == (wait["end"] - wait["start"]) / 1e9 > 0
    # Raised while the first run went: before its span ended.
    assert first.start_time <= wait["start"] <= first.end_time


@pytest.mark.parametrize("where_resumed", ["this process", "another process"])
async def test_a_stored_runs_wait_spans_from_its_raise_to_its_answer(
    kept: tuple[str, str], tmp_path: Path, where_resumed: str
) -> None:
    kind, where = kept
    ns = agent(tmp_path)
    halted, exporter, provider = await halt(ns, kind, where)
    assert halted.pending is not None and halted.run_id is not None
    (first,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent"]
    stored = await stored_times(ns, kind, where, halted.run_id)
    raised = stored.requests["c1"].raised_at
    assert raised is not None

    with anyio.fail_after(LIMIT):
        if where_resumed == "this process":
            out = await ns["answer_and_resume"](kind, where, halted.pending.id)
        else:
            root = str(Path(__file__).resolve().parents[1])
            path = os.pathsep.join([str(tmp_path), root, os.environ.get("PYTHONPATH", "")])
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-W",
                    "error",
                    str(tmp_path / "agent.py"),
                    kind,
                    where,
                    halted.pending.id,
                ],
                env={**os.environ, "PYTHONPATH": path},
                check=False,
            )
            assert done.returncode == 0, done.stderr.decode()
            out = json.loads(done.stdout)
    assert out["text"] == "paid 30"
    answered = await answered_at(ns, kind, where, halted.run_id)
    check_wait(out["spans"], first, raised, answered, halted.pending.id)
    provider.shutdown()
    assert_no_leaks()


async def test_a_version_5_sqlite_file_gains_raised_at(tmp_path: Path) -> None:
    """A request kept before the column has no known raise time: its resumed wait is an
    instant, as before; one raised after the migration is timed."""
    from toolnexus_async.durable.sqlite._schema import SCHEMA_VERSION

    ns = agent(tmp_path)
    path = tmp_path / "v5.db"
    old, _, old_provider = await halt(ns, "sqlite", str(path))
    with sqlite3.connect(path) as db:  # as a version 5 file was
        db.execute("ALTER TABLE requests DROP COLUMN raised_at")
        db.execute("PRAGMA user_version = 5")
    db.close()
    new, _, new_provider = await halt(ns, "sqlite", str(path))  # opens (migrates) it
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (6,)
    db.close()
    await check_migrated(ns, "sqlite", str(path), old, new)
    old_provider.shutdown()
    new_provider.shutdown()
    assert_no_leaks()


async def test_a_version_4_postgres_schema_gains_raised_at(pg_dsn: str, tmp_path: Path) -> None:
    from toolnexus_async.durable.postgres._schema import SCHEMA_VERSION

    ns = agent(tmp_path)
    old, _, old_provider = await halt(ns, "postgres", pg_dsn)
    conn = await asyncpg.connect(pg_dsn)
    try:  # as a version 4 schema was
        await conn.execute("ALTER TABLE toolnexus.requests DROP COLUMN raised_at")
        await conn.execute("UPDATE toolnexus.meta SET value = '4' WHERE key = 'version'")
        new, _, new_provider = await halt(ns, "postgres", pg_dsn)  # opens (migrates) it
        version = await conn.fetchval("SELECT value FROM toolnexus.meta WHERE key = 'version'")
    finally:
        await conn.close()
    assert version == str(SCHEMA_VERSION) == "5"
    await check_migrated(ns, "postgres", pg_dsn, old, new)
    old_provider.shutdown()
    new_provider.shutdown()
    assert_no_leaks()


async def check_migrated(
    ns: dict[str, Any], kind: str, where: str, old: RunResult, new: RunResult
) -> None:
    assert old.run_id is not None and new.run_id is not None
    assert old.pending is not None and new.pending is not None
    assert (await stored_times(ns, kind, where, old.run_id)).requests["c1"].raised_at is None
    assert (await stored_times(ns, kind, where, new.run_id)).requests["c1"].raised_at is not None
    with anyio.fail_after(LIMIT):
        out = await ns["answer_and_resume"](kind, where, old.pending.id)
    assert out["text"] == "paid 30"
    (wait,) = [s for s in out["spans"] if s["name"] == "wait approval"]
    assert wait["attributes"]["toolnexus.wait.outcome"] == "approved"
    # Unknown raise time: an instant at the resume, with no seconds.
    assert wait["start"] == wait["end"] and "toolnexus.wait.seconds" not in wait["attributes"]


async def test_a_wait_taken_over_from_a_dead_worker_spans_from_its_raise(
    kept: tuple[str, str], tmp_path: Path
) -> None:
    """Host A parks the run on its approval and stops being heard of (its upkeep cancelled,
    as if SIGKILLed); host B takes the run over once A's lease ran out and waits on. B's
    wait span starts when the store says the request was raised, not at the takeover."""
    kind, where = kept
    ns = agent(tmp_path)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dead_inbox, inbox = Inbox(), Inbox()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with (
            ns["open_store"](kind, where) as store_a,
            ns["open_store"](kind, where) as store_b,
            LlmClient.in_process(ns["model"], wait_for=dead_inbox) as dead_client,
            LlmClient.in_process(
                ns["model"], wait_for=inbox, tracing=Tracing(tracer_provider=provider)
            ) as client,
            DurableHost(
                client, ns["toolkit"](), store_b, on_result=results.append, lease=1.0, sweep=0.02
            ) as other,
            DurableHost(dead_client, ns["toolkit"](), store_a, lease=1.0) as dead,
            anyio.create_task_group() as doomed,
        ):
            doomed.start_soon(dead.run, "pay the invoice")
            await until(lambda: len(dead_inbox) == 1)
            background = dead._background
            assert background is not None
            background.cancel()  # nothing renews A's lease from now on
            await until(lambda: len(inbox) == 1)  # B took the run over and waits on
            (request,) = inbox.pending()
            (asked,) = await other.outstanding()
            assert asked.request.id == request.id
            raised = (await store_b.load(asked.run_id)).requests["c1"].raised_at
            assert raised is not None
            await other.answer(Answer(request.id, True), answered_by="user:alice")
            await until(lambda: bool(results))
            doomed.cancel_scope.cancel()
    assert results[0].text == "paid 30"
    (resumed,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent"]
    (wait,) = [s for s in exporter.get_finished_spans() if s.name == "wait approval"]
    assert wait.parent is not None and wait.parent.span_id == resumed.context.span_id
    assert wait.attributes is not None and wait.start_time is not None
    assert wait.end_time is not None and resumed.start_time is not None
    assert wait.start_time == int(raised * 1e9) < resumed.start_time
    assert wait.attributes["toolnexus.wait.resumed"] is True
    assert wait.attributes["toolnexus.wait.outcome"] == "approved"
    seconds = wait.attributes["toolnexus.wait.seconds"]
    assert isinstance(seconds, float)
    assert abs(seconds - (wait.end_time - wait.start_time) / 1e9) < 0.05
    provider.shutdown()
    assert_no_leaks()


async def until(condition: Any) -> None:
    while not condition():
        await anyio.lowlevel.checkpoint()
