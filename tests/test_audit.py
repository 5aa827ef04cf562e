"""The audit trail of answers: who gave each (the host's word), what the request showed,
and what became of it, kept append-only by every store in the transaction that takes the
answer, and shown in a run's history by serve.

Stores are real (SQLite files, PostgreSQL through tests/pg.py); nothing sleeps to
synchronise, and "committed before acknowledged" is read from another connection the
moment the acknowledgement comes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import asyncpg
import pytest

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from tests.test_serve_api import LIMIT, TOKEN, Events, closing, demo_app, events, post, serving
from tests.test_serve_guard import log_in, own_origin
from toolnexus_async import (
    AlreadyAnsweredError,
    Answer,
    AnswerMismatchError,
    Hooks,
    Inbox,
    LlmClient,
    Message,
    Request,
    RunResult,
    StoreError,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
    require_approval,
)
from toolnexus_async._core.audit import shown_digest
from toolnexus_async.durable import (
    AnswerRecord,
    DurableHost,
    MemoryRunStore,
    PostgresRunStore,
    RunStore,
    SqliteRunStore,
)
from toolnexus_async.testing import reply, tool_call

PACKAGE = Path(__file__).resolve().parent.parent / "toolnexus_async"


class Payments:
    """``pay`` behind a require_approval gate (its request carries ``data["digest"]``), and
    ``ask``, a question with no digest of its own."""

    def __init__(self) -> None:
        self.paid: list[int] = []

        @define_tool
        async def pay(amount: int) -> str:
            """Pay an amount."""
            self.paid.append(amount)
            return f"paid {amount}"

        self.tools = [pay]


def model(messages: list[Message], tools: list[Any]) -> Any:
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return f"result: {last.output}"
    return reply(tool_call("pay", {"amount": 30}, id="c1"))


def client(**kw: Any) -> LlmClient:
    gate = require_approval(["pay"])
    return LlmClient.in_process(model, hooks=Hooks(before_tool=gate), **kw)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def kind(request: Any) -> str:
    return str(request.param)


class Opened:
    """A store of one kind, and a way to run SQL on it from outside (another connection)."""

    def __init__(self, kind: str, path: Path, dsn: str | None) -> None:
        self.kind, self.path, self.dsn = kind, path, dsn

    def store(self, **options: Any) -> RunStore:
        if self.kind == "postgres":
            assert self.dsn is not None
            return PostgresRunStore(self.dsn, **options)
        if self.kind == "sqlite":
            return SqliteRunStore(self.path, **options)
        return MemoryRunStore(**options)

    async def sql(self, statement: str) -> list[tuple[Any, ...]]:
        """``statement`` on a connection of its own (the store's tables, PostgreSQL's in
        the ``toolnexus`` schema: write ``{s}`` before a table's name)."""
        if self.kind == "postgres":
            conn = await asyncpg.connect(self.dsn)
            try:
                sql = statement.format(s="toolnexus.")
                if not sql.startswith("SELECT"):
                    await conn.execute(sql)  # several statements, perhaps: no rows
                    return []
                rows = await conn.fetch(sql)
            finally:
                await conn.close()
            return [tuple(row) for row in rows]
        assert self.kind == "sqlite", "a memory store has no outside"
        return [tuple(row) for row in raw_sql(self.path, statement.format(s=""))]


@pytest.fixture
def opened(kind: str, request: Any, tmp_path: Path) -> Opened:
    dsn = str(request.getfixturevalue("pg_dsn")) if kind == "postgres" else None
    return Opened(kind, tmp_path / "runs.db", dsn)


@pytest.fixture(params=["sqlite", "postgres"])
def outside(request: Any, tmp_path: Path) -> Opened:
    """A store that can be read from another connection (not the memory one)."""
    dsn = str(request.getfixturevalue("pg_dsn")) if request.param == "postgres" else None
    return Opened(str(request.param), tmp_path / "runs.db", dsn)


@asynccontextmanager
async def hosted(
    opened: Opened, pay: Payments, results: list[RunResult], **options: Any
) -> AsyncIterator[tuple[RunStore, DurableHost]]:
    """A store of ``opened``'s kind and a host on it whose runs pay through the gate."""
    async with (
        opened.store(**options) as store,
        client() as llm,
        DurableHost(
            llm, _toolkit(pay), store, on_result=results.append, sweep=0.02, poll=0.02
        ) as host,
    ):
        yield store, host


async def halted_run(host: DurableHost) -> tuple[RunResult, Request]:
    halted = await host.run("pay")
    assert halted.status == "pending" and halted.pending is not None
    return halted, halted.pending


async def until_done(results: list[RunResult]) -> RunResult:
    while not results:
        await anyio.lowlevel.checkpoint()
    return results[0]


# -- the host and the store ----------------------------------------------------------------


async def test_the_host_records_who_answered_what_they_saw_and_each_refusal(opened: Opened):
    pay = Payments()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with hosted(opened, pay, results) as (store, host):
            halted, request = await halted_run(host)
            assert request.data is not None and request.data["digest"].startswith("sha256:")
            # Approving another call than the one shown is refused, and kept as refused.
            with pytest.raises(AnswerMismatchError):
                await host.answer(
                    Answer(request.id, True, data={"digest": "sha256:other"}),
                    answered_by="user:mallory",
                )
            await host.answer(
                Answer(request.id, True, data={"digest": request.data["digest"]}),
                answered_by="user:alice",
            )
            await until_done(results)
            before = await store.answers(halted.run_id or "")
            with pytest.raises(AlreadyAnsweredError):
                await host.answer(Answer(request.id, False, reason="declined"), answered_by="bob")
            after = await store.answers(halted.run_id or "")
    assert pay.paid == [30]
    refused_first, taken = before
    assert (refused_first.outcome, refused_first.detail) == ("refused", "mismatch")
    assert refused_first.answered_by == "user:mallory"
    assert taken == AnswerRecord(
        request_id=request.id,
        run_id=halted.run_id,
        call_id="c1",
        outcome="approved",
        detail=None,
        answered_by="user:alice",
        at=taken.at,
        digest=request.data["digest"],  # the digest the approver's page showed and echoed
        worker=host.worker,
    )
    # The late answer is kept beside the one taken, which it did not change.
    assert after[:2] == before
    (late,) = after[2:]
    assert (late.outcome, late.detail, late.answered_by) == ("refused", "already_answered", "bob")
    assert refused_first.at <= taken.at <= late.at
    assert_no_leaks()


async def test_a_question_without_a_digest_is_named_by_its_wire_form(opened: Opened):
    """A request that carries no digest (a question) is recorded by the SHA-256 of its
    wire form, which is what any client is shown of it."""

    @define_tool
    async def ask() -> ToolResult:
        """Ask who."""
        return ToolResult.pending(Request("", "input", "Who should know?", data={"max": 2}))

    def asks(messages: list[Message], tools: list[Any]) -> Any:
        return "ok" if isinstance(messages[-1], ToolReturn) else reply(tool_call("ask", id="q1"))

    with anyio.fail_after(LIMIT):
        async with (
            opened.store() as store,
            LlmClient.in_process(asks) as llm,
            DurableHost(llm, _toolkit_of(ask), store, sweep=0.02) as host,
        ):
            halted = await host.run("who")
            assert halted.pending is not None
            await host.answer(
                Answer(halted.pending.id, False, reason="declined"), answered_by="ann"
            )
            (record,) = await store.answers(halted.run_id or "")
    wire = json.dumps(
        halted.pending.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert record.digest == "sha256:" + hashlib.sha256(wire.encode()).hexdigest()
    assert (record.outcome, record.detail, record.answered_by) == ("declined", "declined", "ann")
    assert_no_leaks()


async def test_the_record_commits_with_the_answer_before_it_is_acknowledged(outside: Opened):
    """Seen from another connection the moment ``answer`` returns; and when the record
    cannot be written, the answer is not taken either (one transaction)."""
    pay = Payments()
    results: list[RunResult] = []
    refuse = (
        "CREATE TRIGGER no_audit BEFORE INSERT ON answers"
        " BEGIN SELECT RAISE(ABORT, 'no audit today'); END"
        if outside.kind == "sqlite"
        else "CREATE FUNCTION toolnexus.no_audit() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'no audit today'; END $$;"
        " CREATE TRIGGER no_audit BEFORE INSERT ON toolnexus.answers"
        " FOR EACH ROW EXECUTE FUNCTION toolnexus.no_audit()"
    )
    allow = (
        "DROP TRIGGER no_audit"
        if outside.kind == "sqlite"
        else "DROP TRIGGER no_audit ON toolnexus.answers"
    )
    with anyio.fail_after(LIMIT):
        async with hosted(outside, pay, results) as (store, host):
            _, request = await halted_run(host)
            await outside.sql(refuse)
            with pytest.raises(StoreError, match="no audit today"):
                await host.answer(Answer(request.id, True), answered_by="user:alice")
            assert (await store.find(request.id)).status == "pending"  # nothing taken
            assert await outside.sql("SELECT count(*) FROM {s}answers") == [(0,)]
            await outside.sql(allow)
            await host.answer(Answer(request.id, True), answered_by="user:alice")
            # Acknowledged: another connection sees the record already.
            assert await outside.sql("SELECT answered_by, outcome FROM {s}answers") == [
                ("user:alice", "approved")
            ]
            await until_done(results)
    assert pay.paid == [30]
    assert_no_leaks()


async def test_the_answers_table_refuses_change_and_outlives_its_runs(outside: Opened):
    pay = Payments()
    results: list[RunResult] = []
    with anyio.fail_after(LIMIT):
        async with hosted(outside, pay, results, keep_finished=0, **_prune_now(outside)) as (
            store,
            host,
        ):
            halted, request = await halted_run(host)
            await host.answer(Answer(request.id, True), answered_by="user:alice")
            await until_done(results)
            assert await store.runs() == []  # the run is forgotten (keep_finished=0)...
            (kept,) = await store.answers(halted.run_id or "")  # ...its answer is not
    assert kept.answered_by == "user:alice"
    for statement in (
        "UPDATE {s}answers SET answered_by = 'someone else'",
        "DELETE FROM {s}answers",
        *(["TRUNCATE {s}answers"] if outside.kind == "postgres" else []),
    ):
        with pytest.raises(Exception, match="append-only"):
            await outside.sql(statement)
    assert await outside.sql("SELECT answered_by FROM {s}answers") == [("user:alice",)]
    assert_no_leaks()


def test_no_statement_of_the_package_changes_or_removes_an_answer_record():
    """Read from the source: no UPDATE, DELETE or TRUNCATE names ``answers``, and the
    table is in no list of table names (which a loop deletes from: pruning, saving)."""
    changing = re.compile(r"(UPDATE|DELETE\s+FROM|TRUNCATE)\s+(\{[^}]*\}\.?|\w+\.)?answers\b", re.I)
    tables = {"runs", "requests", "results", "workers", "events", "mcp_tokens", "answers"}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert not changing.search(text), path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                # Two or more: a list of tables, not a schema's ``required: ["answers"]``.
                listed = len(names) > 1 and names <= tables
                assert not ("answers" in names and listed), (path, node.lineno)


# -- migration ---------------------------------------------------------------------------------


async def test_a_version_4_sqlite_file_gains_the_trail_and_keeps_its_runs(tmp_path: Path):
    from toolnexus_async.durable.sqlite._schema import SCHEMA_VERSION

    path = tmp_path / "v4.db"
    pay = Payments()
    async with SqliteRunStore(path) as store, client() as llm:
        halted = await llm.run("pay", _toolkit(pay))
        await store.save(halted)
    raw_sql(path, "DROP TABLE answers")  # its triggers go with it
    raw_sql(path, "ALTER TABLE requests DROP COLUMN raised_at")  # version 6's
    raw_sql(path, "PRAGMA user_version = 4")
    assert halted.pending is not None
    with anyio.fail_after(LIMIT):
        async with SqliteRunStore(path) as store:
            assert [r.id for r in await store.requests()] == [halted.pending.id]
            await store.accept(Answer(halted.pending.id, True), 1.0, answered_by="user:alice")
            (record,) = await store.answers(halted.run_id or "")
    assert raw_sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(6,)]
    assert record.answered_by == "user:alice"
    with pytest.raises(Exception, match="append-only"):
        raw_sql(path, "DELETE FROM answers")
    assert_no_leaks()


async def test_a_version_3_postgres_schema_gains_the_trail_and_keeps_its_runs(pg_dsn: str):
    from toolnexus_async.durable.postgres._schema import SCHEMA_VERSION

    pay = Payments()
    async with PostgresRunStore(pg_dsn) as store, client() as llm:
        halted = await llm.run("pay", _toolkit(pay))
        await store.save(halted)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("DROP TABLE toolnexus.answers")
        await conn.execute("DROP FUNCTION toolnexus.answers_append_only()")
        await conn.execute("ALTER TABLE toolnexus.requests DROP COLUMN raised_at")  # version 5's
        await conn.execute("UPDATE toolnexus.meta SET value = '3' WHERE key = 'version'")
        assert halted.pending is not None
        with anyio.fail_after(LIMIT):
            async with PostgresRunStore(pg_dsn) as store:
                assert [r.id for r in await store.requests()] == [halted.pending.id]
                await store.accept(Answer(halted.pending.id, True), 1.0, answered_by="user:al")
                (record,) = await store.answers(halted.run_id or "")
        version = await conn.fetchval("SELECT value FROM toolnexus.meta WHERE key = 'version'")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM toolnexus.answers")
    finally:
        await conn.close()
    assert version == str(SCHEMA_VERSION) == "5"
    assert record.answered_by == "user:al"
    assert_no_leaks()


# -- the inbox, and bad input ------------------------------------------------------------------


async def test_an_inbox_keeps_who_answered_in_memory_when_told():
    pay = Payments()
    inbox = Inbox()
    with anyio.fail_after(LIMIT):
        async with client(wait_for=inbox) as llm, anyio.create_task_group() as tg:
            done: list[RunResult] = []

            async def run() -> None:
                done.append(await llm.run("pay", _toolkit(pay)))

            tg.start_soon(run)
            while not inbox.pending():
                await anyio.lowlevel.checkpoint()
            (request,) = inbox.pending()
            with pytest.raises(UsageError, match="printable"):
                await inbox.answer(Answer(request.id, True), answered_by="alice\u202e")
            assert inbox.get(request.id) == request  # refused before anything changed
            inbox.answer_nowait(Answer(request.id, True), answered_by="user:carol")
    record = inbox.answered(request.id)
    assert record is not None and done[0].text == "result: paid 30"
    assert (record.outcome, record.answered_by, record.run_id) == (
        "approved",
        "user:carol",
        done[0].run_id,
    )
    assert request.data is not None and record.digest == request.data["digest"]
    assert record.digest == shown_digest(request)
    assert_no_leaks()


async def test_an_answer_from_another_thread_says_who_too():
    inbox = Inbox()
    got: list[Answer] = []

    async def park() -> None:
        got.append(await inbox(Request("req_t", "question", "Which one?")))

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(park)
            while not inbox.pending():
                await anyio.lowlevel.checkpoint()
            answer = Answer("req_t", True, data={"pick": 2})
            await anyio.to_thread.run_sync(
                lambda: inbox.answer_threadsafe(answer, 5, answered_by="bot:relay")
            )
    record = inbox.answered("req_t")
    assert got == [answer] and record is not None and record.answered_by == "bot:relay"
    assert record.digest == shown_digest(Request("req_t", "question", "Which one?"))
    assert_no_leaks()


@pytest.mark.parametrize("bad", ["", "x" * 201, "line\nbreak", 7])
async def test_answered_by_must_be_a_short_printable_string(bad: Any):
    with anyio.fail_after(LIMIT):
        async with MemoryRunStore() as store:
            with pytest.raises(UsageError, match="answered_by"):
                await store.accept(Answer("req_x", True), 1.0, answered_by=bad)


# -- serve ---------------------------------------------------------------------------------


async def first_pending(stream: Events, run_id: str) -> dict[str, Any]:
    request: dict[str, Any] = (await stream.until("pending", run_id=run_id))["request"]
    return request


def wire_of(shown: dict[str, Any]) -> Request:
    """The request a client was shown, without what serve adds beside it."""
    return Request.from_dict({k: v for k, v in shown.items() if k not in ("display", "run_id")})


@pytest.fixture
async def file_store(tmp_path: Path) -> AsyncIterator[tuple[SqliteRunStore, Path]]:
    path = tmp_path / "serve.db"
    yield SqliteRunStore(path), path


async def test_serve_records_the_api_client_and_shows_it_in_the_run(file_store: Any):
    store, path = file_store
    with anyio.fail_after(LIMIT):
        async with serving(closing(demo_app(store), store)) as http, events(http) as stream:
            _, started = await post(http, "/runs", {"prompt": "Dinner"})
            run_id = started["id"]
            shown = await first_pending(stream, run_id)
            assert await post(http, f"/requests/{shown['id']}/answer", {"ok": True}) == (
                200,
                {"id": shown["id"], "ok": True},
            )
            # Acknowledged: the record is in the file, read by another connection.
            assert raw_sql(path, "SELECT answered_by, outcome FROM answers") == [
                ("api", "approved")
            ]
            assert (await post(http, f"/requests/{shown['id']}/answer", {"ok": False}))[0] == 409
            await first_pending(stream, run_id)  # the run went on to its next request
            async with http.get(f"/runs/{run_id}") as got:
                run = await got.json()
    step = run["steps"][0]
    assert step["answer"]["answered_by"] == "api"
    assert step["answer"]["digest"] == shown_digest(wire_of(shown))
    taken, late = run["answers"]
    assert taken["answered_by"] == "api" and taken["outcome"] == "approved"
    assert taken["digest"] == shown_digest(wire_of(shown)) and taken["at"] > 0
    assert (late["outcome"], late["detail"]) == ("refused", "already_answered")
    _no_secret_in(path, TOKEN)


async def test_serve_records_the_page_session_never_its_id(file_store: Any):
    store, path = file_store
    with anyio.fail_after(LIMIT):
        async with serving(closing(demo_app(store), store), headers=None) as http:
            session = await log_in(http)
            page = {"Cookie": f"toolnexus_session_{http.port}={session}", **own_origin(http)}
            async with http.get("/events", headers=page) as response:
                stream = Events(response)
                async with http.post("/runs", json={"prompt": "Dinner"}, headers=page) as r:
                    run_id = (await r.json())["id"]
                shown = await first_pending(stream, run_id)
                answer_path = f"/requests/{shown['id']}/answer"
                async with http.post(answer_path, json={"ok": True}, headers=page) as r:
                    assert r.status == 200
                await first_pending(stream, run_id)
            async with http.get(f"/runs/{run_id}", headers=page) as got:
                run = await got.json()
    (taken,) = run["answers"]
    assert re.fullmatch(r"session:[0-9a-f]{12}", taken["answered_by"])
    assert session[:12] not in taken["answered_by"]
    assert run["steps"][0]["answer"]["answered_by"] == taken["answered_by"]
    _no_secret_in(path, TOKEN, session)


def _no_secret_in(path: Path, *secrets: str) -> None:
    """Neither the token nor a session id is in any record, or anywhere in the file."""
    rows = raw_sql(path, "SELECT * FROM answers") + raw_sql(path, "SELECT data FROM events")
    files = [p for p in path.parent.iterdir() if p.name.startswith(path.name)]
    for secret in secrets:
        assert rows and not any(secret in str(row) for row in rows)
        assert not any(secret.encode() in p.read_bytes() for p in files)


# -- helpers -------------------------------------------------------------------------------


def _toolkit(pay: Payments) -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=pay.tools)


def _toolkit_of(*tools: Any) -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=list(tools))


def _prune_now(opened: Opened) -> dict[str, Any]:
    """PostgreSQL prunes at most every ``prune_every`` seconds: now, for this test."""
    return {"prune_every": 0.0} if opened.kind == "postgres" else {}
