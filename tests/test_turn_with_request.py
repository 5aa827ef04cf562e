"""A turn written with the request its ``require_approval`` gate raised (issue 41).

The journal keeps a turn from the model's reply until the first of its calls needs it
written: before a tool or a host's ``before_tool`` hook runs (the fence), or with the
request a gate raised before anything of the turn ran, in that request's transaction.
So a gated run quite alone takes 5 write transactions over the ``serve`` path (start; turn
and request; answer; result; end), not 6, and one driven by ``host.run`` writes its
start, its turn and its request in one. Counted by the database: on PostgreSQL the
transaction ids it assigned (``pg_snapshot_xmax``) and the transaction that wrote each
row (``xmin``); on SQLite the ``BEGIN IMMEDIATE`` transactions its connection ran (a trace
callback on the store's connection). A turn whose first call runs a tool, or a host's own
hook, is written before it, alone; calls of one turn that go at once write it once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from tests.pg import next_xid
from tests.test_host import LIMIT, until
from toolnexus_async import (
    Answer,
    Hooks,
    Inbox,
    LlmClient,
    Message,
    RunResult,
    StreamToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    define_tool,
    require_approval,
)
from toolnexus_async.durable import (
    DurableHost,
    PostgresRunStore,
    RunStore,
    SqliteRunStore,
)
from toolnexus_async.durable.sqlite._file import RunFile
from toolnexus_async.testing import reply, tool_call

GATE = Hooks(before_tool=require_approval(["pay"]))


def pay_model(messages: list[Message], tools: list[Any]) -> Any:
    """Calls pay, then reports its result."""
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(tool_call("pay", id="c1"))


def pay_toolkit(paid: list[str]) -> Toolkit:
    @define_tool(name="pay")
    async def pay() -> str:
        """Pay (the gate asks first)."""
        paid.append("paid")
        return "paid"

    return Toolkit.create(builtins=False, extra_tools=[pay])


def traced_sqlite(path: Path) -> tuple[SqliteRunStore, list[str]]:
    """A SQLite store whose connection tells each statement it runs, in order."""
    seen: list[str] = []

    class Traced(RunFile):
        def _connect(self) -> Any:
            conn = super()._connect()
            conn.set_trace_callback(seen.append)
            return conn

    class Store(SqliteRunStore):
        _file_class = Traced

    return Store(path), seen


def transactions(seen: list[str]) -> list[list[str]]:
    """The write transactions traced: each one's statements, ``BEGIN IMMEDIATE`` to
    ``COMMIT``."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for sql in list(seen):
        if sql == "BEGIN IMMEDIATE":
            current = []
        elif current is not None:
            if sql in ("COMMIT", "ROLLBACK"):
                if sql == "COMMIT":
                    found.append(current)
                current = None
            else:
                current.append(sql.strip())
    return found


def _has(transaction: list[str], start: str) -> bool:
    return any(sql.startswith(start) for sql in transaction)


Counter = Callable[[], Awaitable[int]]


async def per_run(host: DurableHost, inbox: Inbox, count: Counter, *, begin: bool) -> list[int]:
    """Write transactions of one gated run alone, begun (``serve``'s way) or run
    (``host.run``): until the request is listed, then until the run is done."""
    before = await count()
    done: list[RunResult] = []

    async def run() -> None:
        if begin:
            begun = await host.begin("pay")
            done.append(await begun.run())
        else:
            done.append(await host.run("pay"))

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await until(lambda: len(inbox) == 1)
            parked = await count()
            (request,) = inbox.pending()
            await host.answer(Answer(request.id, True))
        after = await count()
    assert [(r.status, r.text) for r in done] == [("done", "result: paid")]
    return [parked - before, after - before]


async def lone_runs(db: RunStore, count: Counter) -> tuple[list[int], list[int]]:
    """The counts of :func:`per_run`, begun then run, each after a warm-up run."""
    paid: list[str] = []
    inbox = Inbox()
    async with (
        pay_toolkit(paid) as toolkit,
        LlmClient.in_process(pay_model, wait_for=inbox, hooks=GATE) as client,
        # No sweep, renewal or poll in the window: only the run's own writes count.
        DurableHost(client, toolkit, db, lease=600, sweep=600, poll=600) as host,
    ):
        await per_run(host, inbox, count, begin=True)  # warm: the schema, the lease row
        begun = await per_run(host, inbox, count, begin=True)
        run = await per_run(host, inbox, count, begin=False)
    assert paid == ["paid"] * 3
    return begun, run


async def test_a_gated_run_alone_takes_five_write_transactions_on_postgres(pg_dsn: str):
    # begun: start | turn + request | answer, result, end. run: start + turn + request |
    # answer, result, end. (Before: the turn and the request each had their own.)
    async with PostgresRunStore(pg_dsn) as db:
        begun, run = await lone_runs(db, lambda: next_xid(pg_dsn))
    assert begun == [2, 5], begun
    assert run == [1, 4], run


async def test_a_gated_run_alone_takes_five_write_transactions_on_sqlite(tmp_path: Path):
    db, seen = traced_sqlite(tmp_path / "runs.db")

    async def count() -> int:
        return len(transactions(seen))

    async with db:
        begun, run = await lone_runs(db, count)
    assert begun == [2, 5], begun
    assert run == [1, 4], run
    merged = [t for t in transactions(seen) if _has(t, "INSERT INTO requests")]
    assert merged and all(_has(t, "UPDATE runs SET turn") for t in merged[:2])  # begun ones
    assert all(_has(t, "INSERT INTO runs") for t in merged[2:])  # run: the start too


def two_calls(first: str, second: str) -> Callable[[list[Message], list[Any]], Any]:
    """A model whose first turn calls ``first`` and ``second`` at once."""

    def model(messages: list[Message], tools: list[Any]) -> Any:
        if isinstance(messages[-1], ToolReturn):
            return "done"
        return reply(tool_call(first, id="c1"), tool_call(second, id="c2"))

    return model


async def test_a_turn_is_written_before_any_tool_or_hook_runs_and_once(tmp_path: Path):
    """Four runs of two calls at once on one SQLite store: the gated call first (the turn
    goes with its request; the tool waits for that write, then finds its turn stored), the
    tool first (the turn goes alone, before the tool; the request after), a host's own
    ``before_tool`` hook instead of the gate (it runs behind the fence, so the turn goes
    alone before it), and the gated call first with the calls shown to a stream (the turn
    is written before they are shown, so alone). Each turn is written once."""
    db, seen = traced_sqlite(tmp_path / "runs.db")
    found: list[tuple[str, int, int]] = []

    async def look_in_store(who: str, ctx: ToolContext | None) -> None:
        assert ctx is not None and ctx.run_id is not None
        stored = await db.load(ctx.run_id)
        last = stored.state.messages[-1]
        found.append((who, stored.turn, len(getattr(last, "tool_calls", ()))))

    @define_tool(name="pay")
    async def pay() -> str:
        """Pay."""
        return "paid"

    @define_tool(name="look")
    async def look(ctx: ToolContext | None = None) -> str:
        """Look something up."""
        await look_in_store("look", ctx)
        return "seen"

    async def hook(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
        await look_in_store(f"hook {name}", ctx)
        return None

    shown: list[bool] = []

    def on_event(event: object) -> None:
        if isinstance(event, StreamToolCall):  # the turn committed before it is shown?
            shown.append(any(_has(t, "UPDATE runs SET turn") for t in transactions(seen)[at:]))

    at = 0

    async def drive(model: Any, hooks: Hooks, streamed: bool = False) -> list[list[str]]:
        nonlocal at
        inbox = Inbox()
        already = at = len(transactions(seen))
        async with (
            Toolkit.create(builtins=False, extra_tools=[pay, look]) as toolkit,
            LlmClient.in_process(model, wait_for=inbox, hooks=hooks) as client,
            DurableHost(client, toolkit, db, lease=600, sweep=600, poll=600) as host,
        ):
            done: list[RunResult] = []

            async def run() -> None:
                begun = await host.begin("go")
                done.append(await begun.run(on_event if streamed else None))

            with anyio.fail_after(LIMIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    if hooks is GATE:
                        await until(lambda: len(inbox) == 1)
                        (request,) = inbox.pending()
                        await host.answer(Answer(request.id, True))
            assert [r.text for r in done] == ["done"]
        return transactions(seen)[already:]

    async with db:
        gate_first = await drive(two_calls("pay", "look"), GATE)
        tool_first = await drive(two_calls("look", "pay"), GATE)
        hooked = await drive(two_calls("look", "pay"), Hooks(before_tool=hook))
        streamed = await drive(two_calls("pay", "look"), GATE, streamed=True)
    # Every tool and hook found its turn stored, with both calls; so did the stream.
    assert sorted(found) == sorted(
        [("look", 1, 2)] * 4 + [("hook look", 1, 2), ("hook pay", 1, 2)]
    ), found
    assert shown == [True, True]
    for written in (gate_first, tool_first, hooked, streamed):
        assert sum(_has(t, "UPDATE runs SET turn") for t in written) == 1, written
    # Gate first: its request in the turn's transaction. Tool first: not.
    (asked,) = [t for t in gate_first if _has(t, "INSERT INTO requests")]
    assert _has(asked, "UPDATE runs SET turn")
    (asked,) = [t for t in tool_first if _has(t, "INSERT INTO requests")]
    assert not _has(asked, "UPDATE runs SET turn")
    assert not any(_has(t, "INSERT INTO requests") for t in hooked)
    # Streamed: the turn is written before its calls are shown, so alone.
    (asked,) = [t for t in streamed if _has(t, "INSERT INTO requests")]
    assert not _has(asked, "UPDATE runs SET turn")


async def test_calls_at_once_write_their_turn_once_with_the_gates_request_on_postgres(
    pg_dsn: str,
):
    """The same on PostgreSQL, told by the rows: the turn's two ``tool_call`` events, the
    gate's request and its ``pending`` event were written by one transaction (``xmin``),
    and the tool running beside the gated call found its turn stored."""
    seen: list[int] = []

    async with PostgresRunStore(pg_dsn) as db:

        @define_tool(name="pay")
        async def pay() -> str:
            """Pay."""
            return "paid"

        @define_tool(name="look")
        async def look(ctx: ToolContext | None = None) -> str:
            """Look something up."""
            assert ctx is not None and ctx.run_id is not None
            seen.append((await db.load(ctx.run_id)).turn)
            return "seen"

        inbox = Inbox()
        async with (
            Toolkit.create(builtins=False, extra_tools=[pay, look]) as toolkit,
            LlmClient.in_process(two_calls("pay", "look"), wait_for=inbox, hooks=GATE) as client,
            DurableHost(client, toolkit, db, lease=600, sweep=600, poll=600) as host,
        ):
            done: list[RunResult] = []

            async def run() -> None:
                begun = await host.begin("go")
                done.append(await begun.run())

            with anyio.fail_after(LIMIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    await until(lambda: len(inbox) == 1)
                    (request,) = inbox.pending()
                    conn = await asyncpg.connect(pg_dsn)
                    try:
                        rows = await conn.fetch(
                            "SELECT kind, xmin::text FROM toolnexus.events"
                            " WHERE kind IN ('tool_call', 'pending') ORDER BY seq"
                        )
                        asked = await conn.fetchval(
                            "SELECT xmin::text FROM toolnexus.requests WHERE request_id = $1",
                            request.id,
                        )
                    finally:
                        await conn.close()
                    await host.answer(Answer(request.id, True))
            assert [r.text for r in done] == ["done"]
    assert seen == [1]
    assert [row[0] for row in rows] == ["tool_call", "tool_call", "pending"]
    assert {row[1] for row in rows} == {asked}
