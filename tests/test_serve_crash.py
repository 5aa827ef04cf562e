"""``kill -9`` of a real server process loses nothing it acknowledged (issue 12).

Every server here is a child process on a SQLite store file in ``tmp_path``: the real
command (``python -m toolnexus_async serve``, the demo: login, question, approval), or
:data:`SCRIPT`, a small server on the public API (``create_app``, ``run_server``) whose
tools append what they do to an effects file, fsync'd, one line per execution tagged with
the process id, so the test can count executions across processes. A server is killed
with SIGKILL and a new one is started on the same file; its short ``--lease`` (1 s) lets
it take the dead server's runs over quickly.

Nothing sleeps to synchronise: a test polls the HTTP API (or the effects file) until it
shows what the test waits for, under ``anyio.fail_after`` (:func:`eventually`). The one
sleep waits for the wall clock to pass a request's ``expires_at``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from tests.test_serve_api import Events
from toolnexus_async.serve import TOKEN_ENV

T = TypeVar("T")

LIMIT = 60  # seconds any one test may take (a hang guard; a loaded machine starts servers slowly)
WAIT = 20  # seconds any one wait may take
POLL = 0.05  # seconds between two looks at the API
TOKEN = "crash-tests-token-0123456789"
LEASE = "1"  # seconds: a dead server's runs are taken over this soon
ROOT = Path(__file__).resolve().parents[1]

# The demo's answer to each kind of request it makes: log in, choose, approve.
DEMO_ANSWERS: dict[str, dict[str, Any]] = {
    "authorization": {"ok": True},
    "question": {"ok": True, "data": {"answers": ["Sakura", "4"]}},
    "approval": {"ok": True},
}
LOGIN_DECLINED = "I stopped: you are not logged in (the login was cancelled)."

SCRIPT = '''
import os, sys
from datetime import UTC, datetime, timedelta

import anyio

from toolnexus_async import (
    AssistantMessage, LlmClient, Request, ToolCall, ToolContext, Toolkit,
    ToolResult, ToolReturn, UserMessage, define_tool,
)
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import create_app, run_server

STORE, EFFECTS, MODE, TOKEN, LEASE = sys.argv[1:6]


def effect(what, ctx):
    """One line per execution, on disk before the tool goes on."""
    with open(EFFECTS, "a") as f:
        f.write(f"{os.getpid()} {what} {ctx.idempotency_key}\\n")
        f.flush()
        os.fsync(f.fileno())


@define_tool
async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
    """Pay; needs approval."""
    assert ctx is not None
    if ctx.answer is None:
        effect("pay asked", ctx)
        return ToolResult.pending(Request("", "approval", f"Pay {amount} EUR?"))
    effect("pay paid", ctx)
    return ToolResult.ok(f"paid {amount}")


@define_tool
async def ship(ctx: ToolContext | None = None) -> str:
    """Ship the order: slow (in MODE "hang", it never ends)."""
    assert ctx is not None
    effect("ship started", ctx)
    if MODE == "hang":
        await anyio.sleep_forever()
    effect("ship shipped", ctx)
    return "shipped"


@define_tool
async def confirm(seconds: float, ctx: ToolContext | None = None) -> ToolResult:
    """Ask for a confirmation that expires after ``seconds``."""
    assert ctx is not None
    if ctx.answer is None:
        effect("confirm asked", ctx)
        expires = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
        return ToolResult.pending(Request("", "approval", "Confirm the order?", expires_at=expires))
    effect("confirm confirmed", ctx)
    return ToolResult.ok("confirmed")


def model(messages, tools):
    """"pay, ship": both in one turn; "pay": pay 30, then ship in the next turn; "confirm N":
    confirm, expiring in N s. Then a text with every result."""
    prompt = next(m.text for m in messages if isinstance(m, UserMessage))
    done = [m for m in messages if isinstance(m, ToolReturn)]
    names = [m.name for m in done]
    if prompt == "pay, ship" and not done:
        calls = (ToolCall("c1", "pay", {"amount": 30}), ToolCall("c2", "ship", {}))
        return AssistantMessage(None, calls)
    if prompt == "pay" and "pay" not in names:
        return AssistantMessage(None, (ToolCall("c1", "pay", {"amount": 30}),))
    if prompt == "pay" and "ship" not in names:
        return AssistantMessage(None, (ToolCall("c2", "ship", {}),))
    if prompt.startswith("confirm") and not done:
        seconds = float(prompt.split()[1])
        return AssistantMessage(None, (ToolCall("c1", "confirm", {"seconds": seconds}),))
    return " | ".join(f"{m.name}={m.output}" for m in done)


async def main():
    async with (
        SqliteRunStore(STORE) as store,
        Toolkit.create(builtins=False, extra_tools=[pay, ship, confirm]) as toolkit,
    ):
        app = create_app(
            make_client=lambda inbox: LlmClient.in_process(model, wait_for=inbox),
            toolkit=toolkit,
            store=store,
            park_timeout=600,
            lease=float(LEASE),
            token=TOKEN,
        )
        await run_server(
            app, port=0, on_ready=lambda url: print(f"Open the inbox: {url}/", flush=True)
        )


anyio.run(main)
'''


class Server:
    """A server in a child process, and an HTTP session that carries its token."""

    def __init__(
        self, process: anyio.abc.Process, session: aiohttp.ClientSession, name: str
    ) -> None:
        self.process = process
        self.session = session
        self.name = name

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(path) as reply:
            return reply.status, await reply.json()

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        async with self.session.post(path, json=body) as reply:
            return reply.status, await reply.json()

    async def start_run(self, prompt: str) -> str:
        status, body = await self.post("/runs", {"prompt": prompt})
        assert status == 202, body
        run_id: str = body["id"]
        return run_id

    async def answer(self, request_id: str, body: dict[str, Any]) -> tuple[int, Any]:
        return await self.post(f"/requests/{request_id}/answer", body)

    async def all_of(self, path: str, key: str) -> list[dict[str, Any]]:
        """Every item of a paged list (``GET /runs``, ``GET /requests``), page after page."""
        items: list[dict[str, Any]] = []
        cursor = ""
        while True:
            status, body = await self.get(f"{path}?limit=500&cursor={cursor}")
            assert status == 200, body
            items.extend(body[key])
            if body["next"] is None:
                return items
            cursor = body["next"]

    async def requests(self) -> list[dict[str, Any]]:
        """``GET /requests``: what the store has outstanding."""
        return await self.all_of("/requests", "requests")

    async def runs(self) -> dict[str, dict[str, Any]]:
        """``GET /runs``, by run id."""
        return {run["id"]: run for run in await self.all_of("/runs", "runs")}

    async def run(self, run_id: str) -> dict[str, Any]:
        status, body = await self.get(f"/runs/{run_id}")
        assert status == 200, body
        run: dict[str, Any] = body
        return run

    async def kill(self) -> None:
        """``kill -9``: no shutdown, no last write."""
        self.process.send_signal(signal.SIGKILL)
        with anyio.fail_after(WAIT):
            assert await self.process.wait() == -signal.SIGKILL


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@asynccontextmanager
async def server(command: list[str], logs: Path) -> AsyncIterator[Server]:
    """Start ``command``, wait for the URL it prints, and serve a session to it; on the way
    out the process is killed if it still runs, and always waited for. Its stderr goes to
    ``logs`` (printed here, so a failing test shows it)."""
    name = logs.stem
    with logs.open("ab") as err:
        async with await anyio.open_process(command, stderr=err, env=child_env()) as process:
            try:
                assert process.stdout is not None
                out = BufferedByteReceiveStream(process.stdout)
                line = ""
                with anyio.fail_after(WAIT):
                    while not line.startswith("Open the inbox: "):
                        try:
                            line = (await out.receive_until(b"\n", 1 << 16)).decode()
                        except anyio.EndOfStream:
                            raise AssertionError(f"{name} ended before it listened") from None
                base = line.removeprefix("Open the inbox: ").split("/?", 1)[0].rstrip("/")
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with aiohttp.ClientSession(base, headers=headers) as session:
                    yield Server(process, session, name)
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.CancelScope(shield=True):
                    await process.wait()
                print(f"--- {name} stderr ---\n{logs.read_text()}")


def demo_server(
    tmp_path: Path, name: str, *, lease: str = LEASE
) -> AbstractAsyncContextManager[Server]:
    """``toolnexus-async serve`` (the demo) on ``tmp_path/runs.sqlite``; runs park in memory."""
    command = [sys.executable, "-m", "toolnexus_async", "serve", "--port", "0"]
    command += ["--store", str(tmp_path / "runs.sqlite"), "--token", TOKEN]
    command += ["--lease", lease, "--park-timeout", "600"]
    return server(command, tmp_path / f"{name}.log")


def script_server(
    tmp_path: Path, name: str, mode: str = "finish"
) -> AbstractAsyncContextManager[Server]:
    """:data:`SCRIPT` on ``tmp_path/runs.sqlite``; ``mode="hang"``: ``ship`` never ends."""
    script = tmp_path / "server.py"
    script.write_text(SCRIPT)
    store, effects = tmp_path / "runs.sqlite", tmp_path / "effects.log"
    command = [sys.executable, str(script), str(store), str(effects), mode, TOKEN, LEASE]
    return server(command, tmp_path / f"{name}.log")


async def eventually(what: str, check: Callable[[], Awaitable[T | None]]) -> T:
    """Poll ``check`` until it returns something other than None."""
    try:
        with anyio.fail_after(WAIT):
            while True:
                got = await check()
                if got is not None:
                    return got
                await anyio.sleep(POLL)
    except TimeoutError:
        raise AssertionError(f"waited {WAIT}s for {what}") from None


def effects(tmp_path: Path) -> list[tuple[str, str, str]]:
    """The effects file's lines, as (pid, what, idempotency key)."""
    path = tmp_path / "effects.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, rest = line.split(" ", 1)
        what, key = rest.rsplit(" ", 1)
        out.append((pid, what, key))
    return out


def by_process(lines: list[tuple[str, str, str]]) -> list[list[tuple[str, str]]]:
    """The (what, key) of each process, in the order the processes first wrote."""
    out: dict[str, list[tuple[str, str]]] = {}
    for pid, what, key in lines:
        out.setdefault(pid, []).append((what, key))
    return list(out.values())


def asked(tmp_path: Path) -> dict[str, Counter[str]]:
    """Every request ever kept in the store (answered, expired or pending), counted by kind
    for each run: a request asked twice would show as a second row."""
    rows = raw_sql(tmp_path / "runs.sqlite", "SELECT run_id, body FROM requests")
    out: dict[str, Counter[str]] = {}
    for run_id, body in rows:
        out.setdefault(run_id, Counter())[json.loads(body)["kind"]] += 1
    return out


async def finish_demo_runs(served: Server, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Answer every request listed (each once, 200 each) until every run in ``run_ids`` is
    done; returns the runs then. A request listed again after its 200 fails the test."""
    answered: set[str] = set()

    async def all_done() -> dict[str, dict[str, Any]] | None:
        for request in await served.requests():
            assert request["id"] not in answered, f"listed again after its 200: {request}"
            answered.add(request["id"])
            reply = await served.answer(request["id"], DEMO_ANSWERS[request["kind"]])
            assert reply == (200, {"id": request["id"], "ok": True})
        runs = await served.runs()
        return runs if all(runs[r]["status"] == "done" for r in run_ids) else None

    return await eventually(f"{len(run_ids)} runs done", all_done)


async def test_kill_9_with_20_parked_runs_loses_no_answer_and_asks_nobody_twice(tmp_path: Path):
    """20 runs wait on their login; 10 logins are answered (200) and the server is killed
    at once. The next server lists the 10 others (same ids) and the 10 answered runs go on
    to their question without asking the login again; answering everything finishes all 20,
    each login asked exactly once."""
    with anyio.fail_after(LIMIT):
        async with demo_server(tmp_path, "first") as first:
            run_ids = [await first.start_run(f"Dinner {i}") for i in range(20)]

            async def logins() -> dict[str, str] | None:
                listed = await first.requests()
                assert all(r["kind"] == "authorization" for r in listed), listed
                found = {r["run_id"]: r["id"] for r in listed}
                return found if len(listed) == 20 and set(found) == set(run_ids) else None

            login = await eventually("20 logins", logins)
            answered, waiting = run_ids[:10], run_ids[10:]

            async def approve(run_id: str) -> None:
                reply = await first.answer(login[run_id], {"ok": True})
                assert reply == (200, {"id": login[run_id], "ok": True})

            async with anyio.create_task_group() as tg:
                for run_id in answered:
                    tg.start_soon(approve, run_id)
            await first.kill()  # right after the last 200

        async with demo_server(tmp_path, "second") as second:
            answered_logins = {login[r] for r in answered}
            listed = await second.requests()
            assert {r["id"] for r in listed if r["kind"] == "authorization"} == {
                login[r] for r in waiting
            }
            assert {r["run_id"] for r in listed} <= set(run_ids)

            async def moved_on() -> dict[str, dict[str, Any]] | None:
                listed = await second.requests()
                assert not answered_logins & {r["id"] for r in listed}, listed
                by_run = {r["run_id"]: r for r in listed}
                assert len(by_run) == len(listed), f"a run asks twice at once: {listed}"
                if set(by_run) != set(run_ids):
                    return None
                if any(by_run[r]["kind"] != "question" for r in answered):
                    return None
                return by_run

            now = await eventually("the answered runs at their question", moved_on)
            assert {run_id: now[run_id]["id"] for run_id in waiting} == {
                run_id: login[run_id] for run_id in waiting
            }
            assert not {now[run_id]["id"] for run_id in answered} & set(login.values())

            runs = await finish_demo_runs(second, run_ids)
            for run_id in run_ids:
                assert runs[run_id]["status"] == "done"
                assert "You chose Sakura for 4 at 19:30. Booked Sakura for 4" in (
                    runs[run_id]["text"] or ""
                ), runs[run_id]
            assert await second.requests() == []

    assert asked(tmp_path) == {
        run_id: Counter({"authorization": 1, "question": 1, "approval": 1}) for run_id in run_ids
    }
    assert_no_leaks()


@pytest.mark.parametrize("prompt", ["pay, ship", "pay"], ids=["same-turn", "next-turn"])
async def test_kill_9_while_a_tool_runs_reruns_that_call_only(tmp_path: Path, prompt: str):
    """``pay`` was approved and its result recorded; ``ship`` (in the same turn, or the next)
    is running when the server is killed. After the restart ``pay`` is not run again,
    ``ship`` runs again with the same idempotency key, the run finishes, and nobody is asked
    again."""
    with anyio.fail_after(LIMIT):
        async with (
            script_server(tmp_path, "first", mode="hang") as first,
            first.session.get("/events") as response,
        ):
            stream = Events(response)
            run_id = await first.start_run(prompt)

            async def approval() -> dict[str, Any] | None:
                listed = await first.requests()
                return listed[0] if listed else None

            request = await eventually("the payment's approval", approval)
            assert (request["run_id"], request["prompt"]) == (run_id, "Pay 30 EUR?")
            reply = await first.answer(request["id"], {"ok": True})
            assert reply == (200, {"id": request["id"], "ok": True})
            # A result is on the stream only once the store has it.
            with anyio.fail_after(WAIT):
                paid = await stream.until("tool_result", run_id=run_id, id="c1")
            assert (paid["name"], paid["output"]) == ("pay", "paid 30")

            async def shipping() -> bool | None:
                return True if any(w == "ship started" for _, w, _ in effects(tmp_path)) else None

            await eventually("ship to start", shipping)
            await first.kill()  # while ship runs

        async with script_server(tmp_path, "second") as second:

            async def done() -> dict[str, Any] | None:
                assert await second.requests() == []  # nobody is asked anything
                run = await second.run(run_id)
                return run if run["status"] == "done" else None

            run = await eventually("the run to finish", done)
            assert run["text"] == "pay=paid 30 | ship=shipped"

    before, after = by_process(effects(tmp_path))
    (pay_key,) = {key for what, key in before if what.startswith("pay")}
    (ship_key,) = {key for what, key in before if what.startswith("ship")}
    assert pay_key != ship_key
    # Before the kill: pay asked, then paid; ship started (in either order with pay, when
    # they share a turn) and never ended.
    assert Counter(before) == Counter(
        [("pay asked", pay_key), ("pay paid", pay_key), ("ship started", ship_key)]
    )
    assert before.index(("pay asked", pay_key)) < before.index(("pay paid", pay_key))
    # After it: only ship, run again with the same key; pay ran exactly once in all.
    assert after == [("ship started", ship_key), ("ship shipped", ship_key)]
    assert asked(tmp_path) == {run_id: Counter({"approval": 1})}
    assert_no_leaks()


@pytest.mark.parametrize("ok_first", [True, False], ids=["approvals-first", "refusals-first"])
async def test_50_conflicting_answers_on_two_servers_one_wins(tmp_path: Path, ok_first: bool):
    """Two servers on one store, one run parked on the first: 50 answers at once, approvals
    and refusals, each kind to both servers. Exactly one is taken (200), the 49 others are
    409, and the run follows the one taken. (``ok_first``: what the first two answers sent
    say, so that either outcome is likely to be seen; the test follows whichever won.)"""
    with anyio.fail_after(LIMIT):
        async with (
            demo_server(tmp_path, "a", lease="30") as a,
            demo_server(tmp_path, "b", lease="30") as b,
        ):
            run_id = await a.start_run("Dinner, one answer")

            async def login() -> dict[str, Any] | None:
                listed = await b.requests()  # the other server sees it in the store
                return listed[0] if listed else None

            request = await eventually("the login", login)
            assert (request["run_id"], request["kind"]) == (run_id, "authorization")
            replies: list[tuple[str, bool, int, Any]] = []

            async def answer(i: int) -> None:
                served, ok = (a, b)[i % 2], (i % 4 < 2) == ok_first
                status, body = await served.answer(request["id"], {"ok": ok})
                replies.append((served.name, ok, status, body))

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(answer, i)

            taken = [r for r in replies if r[2] == 200]
            assert len(taken) == 1, replies
            ((_, ok, _, body),) = taken
            assert body == {"id": request["id"], "ok": ok}
            refused = [r for r in replies if r[2] != 200]
            assert len(refused) == 49
            assert all(status == 409 for _, _, status, _ in refused), refused
            assert all("answered already" in body["error"] for _, _, _, body in refused)

            if ok:
                # Approved: the run goes on to its question (a new request), on either
                # server's listing; answered through the other server, it finishes.
                async def question() -> dict[str, Any] | None:
                    listed = await b.requests()
                    assert request["id"] not in {r["id"] for r in listed}
                    return listed[0] if listed else None

                asked_next = await eventually("the question", question)
                assert (asked_next["run_id"], asked_next["kind"]) == (run_id, "question")
                assert await a.requests() == [asked_next]
                await finish_on(b, a, run_id)
                assert "Booked Sakura for 4" in ((await a.run(run_id))["text"] or "")
            else:
                # Declined: the model is told so and ends the run.
                async def ended() -> dict[str, Any] | None:
                    run = await a.run(run_id)
                    return run if run["status"] == "done" else None

                assert (await eventually("the run to end", ended))["text"] == LOGIN_DECLINED
                assert await b.requests() == await a.requests() == []
            status, error = await b.answer(request["id"], {"ok": not ok})
            assert status == 409 and "answered already" in error["error"]

    assert asked(tmp_path)[run_id]["authorization"] == 1
    assert_no_leaks()


async def finish_on(answering: Server, parking: Server, run_id: str) -> None:
    """Answer ``run_id``'s requests on ``answering`` until ``parking`` says it is done."""
    answered: set[str] = set()

    async def done() -> bool | None:
        for request in await answering.requests():
            if request["id"] not in answered:
                answered.add(request["id"])
                reply = await answering.answer(request["id"], DEMO_ANSWERS[request["kind"]])
                assert reply == (200, {"id": request["id"], "ok": True})
        return True if (await parking.run(run_id))["status"] == "done" else None

    await eventually(f"run {run_id} done", done)


# before_expiry: a kill and a restart of a serve process must both fit before the expiry,
# also on a loaded machine (4 s was too short there).
@pytest.mark.parametrize(
    ("restart", "seconds"),
    [("none", 1.5), ("after_expiry", 1.5), ("before_expiry", 10.0)],
    ids=["no-crash", "killed-restarted-after-expiry", "killed-restarted-before-expiry"],
)
async def test_an_expired_request_is_not_listed_refused_and_the_run_goes_on(
    tmp_path: Path, restart: str, seconds: float
):
    """A request that expires unanswered: once past ``expires_at`` it is not listed, an
    answer is 409, and the model is told "declined/expired: ..."; the same when the server
    was killed before the expiry and restarted after it (or before it)."""
    with anyio.fail_after(LIMIT):
        async with script_server(tmp_path, "first") as first:
            run_id = await first.start_run(f"confirm {seconds}")

            async def confirmation() -> dict[str, Any] | None:
                listed = await first.requests()
                return listed[0] if listed else None

            request = await eventually("the confirmation", confirmation)
            assert (request["run_id"], request["prompt"]) == (run_id, "Confirm the order?")
            expires = datetime.fromisoformat(request["expiresAt"]).timestamp()
            if restart != "none":
                await first.kill()
                assert time.time() < expires, "killed too late to test a restart"
                await expire_and_check(tmp_path, restart, run_id, request["id"], expires)
            else:
                await check_expired(first, run_id, request["id"], expires)

    assert [w for _, w, _ in effects(tmp_path)] == ["confirm asked"]
    assert asked(tmp_path) == {run_id: Counter({"approval": 1})}
    assert_no_leaks()


async def expire_and_check(
    tmp_path: Path, restart: str, run_id: str, request_id: str, expires: float
) -> None:
    if restart == "after_expiry":
        # The one sleep: for the wall clock to pass expires_at while no server runs.
        await anyio.sleep(max(0.0, expires - time.time()) + 0.05)
    async with script_server(tmp_path, "second") as second:
        if restart == "after_expiry":
            assert request_id not in {r["id"] for r in await second.requests()}
        if restart == "before_expiry":
            listed = await second.requests()
            assert [r["id"] for r in listed] == [request_id]
            assert time.time() < expires, "restarted too late to test it"
        await check_expired(second, run_id, request_id, expires)


async def check_expired(served: Server, run_id: str, request_id: str, expires: float) -> None:
    """The request leaves the listing at its expiry, is refused, and the run ends declined."""

    async def gone() -> bool | None:
        return None if request_id in {r["id"] for r in await served.requests()} else True

    await eventually("the request to expire", gone)
    assert time.time() >= expires - 0.05, "it left the listing before its expiry"
    status, error = await served.answer(request_id, {"ok": True})
    assert status == 409 and "expired" in error["error"], (status, error)

    async def ended() -> dict[str, Any] | None:
        run = await served.run(run_id)
        return run if run["status"] == "done" else None

    run = await eventually("the run to end", ended)
    assert run["text"] == "confirm=declined/expired: Confirm the order?"
    status, error = await served.answer(request_id, {"ok": True})
    assert status == 409, (status, error)
