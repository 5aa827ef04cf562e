"""An MCP server's questions to a person, as suspensions (2026-07-28) or inline (older).

The servers are real (tests/mcp_servers/demo.py). With 2026-07-28 a question is an
``input_required`` result: the call suspends; with a ``wait_for`` the run awaits the
answer and the tool calls the server again with it; without one the run halts, is kept,
and a new process (with a new server process holding the same request-state key) finishes
the call. Older servers ask inline over the open session, answered by the toolkit's
``wait_for``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

from tests.conftest import assert_no_leaks
from tests.mcp_servers.agent import model
from tests.mcp_servers.fixtures import KEY, ROOT, child_pids, config, http_server, stdio_server
from toolnexus_async import Answer, LlmClient, Request, Toolkit
from toolnexus_async.durable import SqliteRunStore, resume_stored

LIMIT = 60


def outcomes(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class Person:
    """A ``wait_for`` that answers every request with ``answer(request)``; it keeps them."""

    def __init__(self, data: dict[str, Any] | None = None, ok: bool = True) -> None:
        self.asked: list[Request] = []
        self.data, self.ok = data, ok

    async def __call__(self, request: Request) -> Answer:
        self.asked.append(request)
        if self.ok:
            return Answer(request.id, True, self.data)
        return Answer(request.id, False, reason="declined")


async def test_a_form_question_is_an_input_request_answered_by_wait_for(tmp_path: Path):
    log = tmp_path / "outcomes.jsonl"
    person = Person({"seat": "window"})
    servers = config(demo=stdio_server(DEMO_OUTCOMES=str(log)))
    async with (
        Toolkit.create(builtins=False, mcp=servers) as tk,
        LlmClient.in_process(model, wait_for=person) as client,
    ):
        done = await client.run('demo_book {"city": "Rome"}', tk)
    assert (done.status, done.text) == ("done", "booked Rome, seat window")
    [asked] = person.asked
    assert (asked.kind, asked.prompt) == ("input", "Which seat for the trip to Rome?")
    assert asked.data is not None and asked.data["schema"]["required"] == ["seat"]
    mcp = asked.data["mcp"]
    assert (mcp["v"], mcp["server"], mcp["tool"], mcp["key"], mcp["mode"]) == (
        1,
        "demo",
        "book",
        "seat",
        "form",
    )
    assert isinstance(mcp["state"], str)  # sealed by the server, opaque to us
    assert outcomes(log) == [{"tool": "book", "action": "accept", "content": {"seat": "window"}}]
    assert_no_leaks()


async def test_without_wait_for_the_run_halts_and_a_new_process_finishes_the_call(tmp_path: Path):
    """Process 1 (this one) halts and keeps the run in SQLite, and its server process is
    stopped; process 2 builds a toolkit from the same config (a new server process with the
    same request-state key) and resumes the run with the answer."""
    log, db, cfg = tmp_path / "outcomes.jsonl", tmp_path / "runs.db", tmp_path / "mcp.json"
    cfg.write_text(
        json.dumps(config(demo=stdio_server(DEMO_STATE_KEY=KEY, DEMO_OUTCOMES=str(log))))
    )
    before = child_pids()
    async with (
        SqliteRunStore(db) as store,
        Toolkit.create(builtins=False, mcp=cfg) as tk,
        LlmClient.in_process(model) as client,
    ):
        halted = await client.run('demo_book {"city": "Oslo"}', tk)
        assert halted.status == "pending" and halted.pending is not None
        await store.save(halted)
    assert child_pids() == before  # the server that asked is gone
    request = halted.pending
    assert Request.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    assert request.kind == "input" and outcomes(log) == []
    answer = json.dumps({"ok": True, "data": {"seat": "aisle"}})
    command = ["-m", "tests.mcp_servers.agent", "resume", str(cfg), str(db), request.id, answer]
    with anyio.fail_after(LIMIT):
        done = await anyio.run_process([sys.executable, *command], cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode().splitlines()[-1]) == {
        "status": "done",
        "text": "booked Oslo, seat aisle",
    }
    assert outcomes(log) == [{"tool": "book", "action": "accept", "content": {"seat": "aisle"}}]
    async with SqliteRunStore(db) as store:
        assert await store.requests() == []


async def test_over_streamable_http_a_kept_question_survives_the_servers_restart(tmp_path: Path):
    db = tmp_path / "runs.db"
    async with SqliteRunStore(db) as store, LlmClient.in_process(model) as client:
        with http_server(DEMO_STATE_KEY=KEY) as url:
            async with Toolkit.create(builtins=False, mcp=config(web={"url": url})) as tk:
                halted = await client.run('web_book {"city": "Lima"}', tk)
            await store.save(halted)
        assert halted.pending is not None and halted.pending.data is not None
        assert halted.pending.data["mcp"]["server"] == "web"
        with http_server(DEMO_STATE_KEY=KEY) as url:  # another process, another port
            async with Toolkit.create(builtins=False, mcp=config(web={"url": url})) as tk:
                answer = Answer(halted.pending.id, True, {"seat": "window"})
                done = await resume_stored(client, tk, store, answer)
    assert (done.status, done.text) == ("done", "booked Lima, seat window")
    assert_no_leaks()


async def test_a_server_without_the_key_refuses_a_state_from_before_its_restart(tmp_path: Path):
    """Without a shared request-state key a restarted server cannot read the state: the
    call ends in an error result naming the server, not in a hang or a crash."""
    db = tmp_path / "runs.db"
    servers = config(demo=stdio_server())
    async with SqliteRunStore(db) as store, LlmClient.in_process(model) as client:
        async with Toolkit.create(builtins=False, mcp=servers) as tk:
            halted = await client.run('demo_book {"city": "Oslo"}', tk)
        await store.save(halted)
        assert halted.pending is not None
        async with Toolkit.create(builtins=False, mcp=servers) as tk:
            answer = Answer(halted.pending.id, True, {"seat": "aisle"})
            done = await resume_stored(client, tk, store, answer)
    assert done.text.startswith("error: MCP tool 'book' of server 'demo': MCPError")
    assert "Invalid or expired requestState" in done.text


async def test_url_mode_is_an_authorization_request_and_more_questions_are_refused(tmp_path: Path):
    person = Person()
    async with (
        Toolkit.create(builtins=False, mcp=config(demo=stdio_server())) as tk,
        LlmClient.in_process(model, wait_for=person) as client,
    ):
        signed = await client.run("demo_login", tk)
        # Asked again on its retry: the rule's "unresolved", never a second question.
        nagging = await client.run('demo_nag {"city": "Rome"}', tk)
        # Two questions in one result: this client relays one per call.
        pair = await client.run("demo_pair", tk)
        halted = await tk.execute("demo_login", {})
    assert signed.text == "signed in"
    login = person.asked[0]
    assert (login.kind, login.prompt, login.url) == (
        "authorization",
        "Sign in to the demo service",
        "https://auth.example.com/authorize?client=demo",
    )
    assert login.data is not None and login.data["mcp"]["mode"] == "url"
    assert nagging.text == "error: unresolved: Which seat for the trip to Rome?"
    assert len(person.asked) == 2  # login, nag once
    assert pair.text == (
        "error: MCP tool 'pair' of server 'demo': the server asked 2 questions at once; "
        "toolnexus_async relays one question per call"
    )
    pending = halted.metadata and halted.metadata["pending"]
    assert isinstance(pending, Request) and pending.kind == "authorization"
    assert halted.output == f"{pending.prompt}\n{pending.url}"


async def test_an_older_server_asks_inline_and_the_toolkits_wait_for_answers(tmp_path: Path):
    log = tmp_path / "outcomes.jsonl"
    legacy = stdio_server(DEMO_LEGACY="1", DEMO_OUTCOMES=str(log))
    person = Person({"seat": "aisle"})
    async with (
        Toolkit.create(builtins=False, mcp=config(old=legacy), wait_for=person) as tk,
        LlmClient.in_process(model) as client,
    ):
        assert tk.mcp_status["old"].protocol == "2025-11-25"
        done = await client.run('old_book {"city": "Bern"}', tk)
    assert (done.status, done.text) == ("done", "booked Bern, seat aisle")
    [asked] = person.asked
    assert asked.kind == "input" and asked.data is not None and "mcp" not in asked.data
    assert asked.data["schema"]["required"] == ["seat"]
    assert outcomes(log) == [{"tool": "book", "action": "accept", "content": {"seat": "aisle"}}]


async def test_an_older_server_is_not_offered_elicitation_without_a_wait_for():
    legacy = stdio_server(DEMO_LEGACY="1")
    async with Toolkit.create(builtins=False, mcp=config(old=legacy)) as tk:
        with anyio.fail_after(LIMIT):
            refused = await tk.execute("old_book", {"city": "Bern"})
    assert refused.is_error and "elicitation" in refused.output.lower()


class Refusing:
    """A ``wait_for`` that refuses every request with ``reason``."""

    def __init__(self, reason: str | None) -> None:
        self.reason = reason

    async def __call__(self, request: Request) -> Answer:
        return Answer(request.id, False, reason=self.reason)


async def test_decline_and_cancel_reach_the_server(tmp_path: Path):
    """A refused question is told to the server (Toolkit.refused): ``decline`` for an
    answer declined, ``cancel`` for anything else; the model hears the rule's
    ``declined/expired``. A stored run answered ``declined`` later does the same."""
    log, db = tmp_path / "outcomes.jsonl", tmp_path / "runs.db"
    servers = config(demo=stdio_server(DEMO_OUTCOMES=str(log)))
    async with (
        SqliteRunStore(db) as store,
        Toolkit.create(builtins=False, mcp=servers) as tk,
        LlmClient.in_process(model, wait_for=Refusing("declined")) as declining,
        LlmClient.in_process(model, wait_for=Refusing("cancelled")) as cancelling,
        LlmClient.in_process(model) as halting,
    ):
        declined = await declining.run('demo_book {"city": "Rome"}', tk)
        cancelled = await cancelling.run("demo_login", tk)
        halted = await halting.run('demo_book {"city": "Oslo"}', tk)
        await store.save(halted)
        assert halted.pending is not None
        later = Answer(halted.pending.id, False, reason="declined")
        stored = await resume_stored(halting, tk, store, later)
    assert declined.text == "error: declined/expired: Which seat for the trip to Rome?"
    assert cancelled.text.startswith("error: declined/expired: Sign in to the demo service")
    assert stored.text == "error: declined/expired: Which seat for the trip to Oslo?"
    assert outcomes(log) == [
        {"tool": "book", "action": "decline", "content": None},
        {"tool": "login", "action": "cancel", "content": None},
        {"tool": "book", "action": "decline", "content": None},
    ]
    assert_no_leaks()
