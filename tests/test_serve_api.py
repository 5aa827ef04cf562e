"""The approval-inbox HTTP API: every route and status, the event stream, spilling.

Each test serves an app on 127.0.0.1 with aiohttp's ``TestServer``, on the runner
``toolnexus-async serve`` uses (:class:`ServeRunner`), and talks to it over HTTP with the
app's token (:data:`TOKEN`, sent as a bearer token by :func:`serving`'s client). Nothing
sleeps to synchronise: a test waits for the event that says what it needs (on
``/events``), under ``anyio.fail_after``. Closing the client shuts the app down, and the
test then demands that no task or future is left behind.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    Request,
    StoreError,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UsageError,
    define_tool,
)
from toolnexus_async.durable import MemoryRunStore, StoredRun
from toolnexus_async.serve import ServeInbox, ServeRunner, create_app
from toolnexus_async.serve import _app as serve_app
from toolnexus_async.serve import _events as serve_events
from toolnexus_async.serve._app import SERVE
from toolnexus_async.serve.demo import demo_client, serve_demo_tools

LIMIT = 10  # seconds any one test may take
# The token of every app these tests build, and the header that carries it.
TOKEN = "serve-tests-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Events:
    """The server-sent events of one ``GET /events`` response, read one at a time."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.comments: list[str] = []
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.ids: list[int | None] = []  # the SSE id of each event of ``seen``

    async def next(self) -> tuple[str, dict[str, Any]]:
        name, data, seq = "", "", None
        while True:
            line = (await self.response.content.readline()).decode()
            assert line, "the event stream ended"
            line = line.rstrip("\n")
            if line.startswith(":"):
                self.comments.append(line)
            elif line.startswith("id: "):
                seq = int(line.removeprefix("id: "))
            elif line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
            elif line == "" and name:
                event = (name, json.loads(data))
                self.seen.append(event)
                self.ids.append(seq)
                return event

    async def until(self, name: str, **match: Any) -> dict[str, Any]:
        """The next event called ``name`` whose data has the items in ``match``."""
        while True:
            got, data = await self.next()
            if got == name and all(data.get(k) == v for k, v in match.items()):
                return data


class GuardedTestServer(TestServer):
    """aiohttp's test server on :class:`ServeRunner`, the runner ``serve`` uses; ``runner``
    holds its arguments (``header_timeout``, say)."""

    def __init__(self, app: web.Application, **runner: Any) -> None:
        super().__init__(app)
        self.runner_kwargs = runner

    async def _make_runner(self, **kwargs: Any) -> ServeRunner:
        return ServeRunner(self.app, **kwargs, **self.runner_kwargs)


@asynccontextmanager
async def serving(
    app: web.Application, *, headers: dict[str, str] | None = AUTH, **runner: Any
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """A client of ``app``, sending ``headers`` (the token) with every request."""
    async with TestClient(GuardedTestServer(app, **runner), headers=headers) as http:
        yield http
    assert_no_leaks()


@asynccontextmanager
async def events(http: TestClient[web.Request, web.Application]) -> AsyncIterator[Events]:
    async with http.get("/events") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        yield Events(response)


def closing(app: web.Application, store: Any) -> web.Application:
    """``app``, closing ``store`` once it has shut down: create_app leaves that to its
    caller, and an open store's connection is reported unclosed (3.13) when collected."""

    async def owned(app: web.Application) -> AsyncIterator[None]:
        # First in the list: opened before the app's own context, closed after it.
        async with store:
            yield

    app.cleanup_ctx.insert(0, owned)
    return app


def demo_app(store: Any = None, **kwargs: Any) -> web.Application:
    """The serve demo on a memory store, closed with the app unless the test gave its own
    (the toolkit is closed by the test's own scope)."""
    toolkit = Toolkit.create(builtins=False, extra_tools=serve_demo_tools())
    own = MemoryRunStore() if store is None else None
    app = create_app(
        make_client=demo_client,
        toolkit=toolkit,
        store=store if own is None else own,
        **{"token": TOKEN, **kwargs},
    )
    return app if own is None else closing(app, own)


async def post(http: Any, path: str, body: Any) -> tuple[int, Any]:
    async with http.post(path, json=body) as response:
        return response.status, await response.json()


async def answer_demo(http: Any, stream: Events, run_id: str) -> dict[str, Any]:
    """Answer the demo's three requests for ``run_id`` (log in, choose, approve); its done."""
    answers = [
        {"ok": True},
        {"ok": True, "data": {"answers": ["Sakura", "4"]}},
        {"ok": True},
    ]
    for body in answers:
        pending = await stream.until("pending", run_id=run_id)
        assert await post(http, f"/requests/{pending['request']['id']}/answer", body) == (
            200,
            {"id": pending["request"]["id"], "ok": True},
        )
    return await stream.until("done", run_id=run_id)


async def test_a_run_is_started_answered_and_finished_over_http():
    """POST /runs, see each request on /events, answer it, see done; GET /runs/{id} agrees."""
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            status, started = await post(http, "/runs", {"prompt": "Dinner for my team"})
            assert status == 202 and started["status"] == "running"
            run_id = started["id"]
            assert await stream.until("run_started") == {
                "run_id": run_id,
                "prompt": "Dinner for my team",
            }
            login = await stream.until("pending", run_id=run_id)
            assert login["request"]["kind"] == "authorization"
            assert login["request"]["url"].startswith("https://")
            async with http.get(f"/runs/{run_id}") as reply:
                assert (await reply.json())["status"] == "pending"

            done = await answer_demo_from(http, stream, run_id, login)
            assert done["status"] == "done"
            assert "Sakura for 4" in done["text"]

            async with http.get(f"/runs/{run_id}") as reply:
                assert reply.status == 200
                got = await reply.json()
                old = ("id", "status", "prompt", "text", "error", "declined", "steps")
                keys = ("id", "name", "arguments", "output", "is_error", "declined")
                shown = {k: got[k] for k in old}
                shown["steps"] = [{k: step[k] for k in keys} for step in got["steps"]]
                assert [step["turn"] for step in got["steps"]] == [1, 2, 3]
                assert [step["answer"]["ok"] for step in got["steps"]] == [True] * 3
                assert shown == {
                    "id": run_id,
                    "status": "done",
                    "prompt": "Dinner for my team",
                    "text": done["text"],
                    "error": None,
                    "declined": False,
                    "steps": [
                        {
                            "id": f"serve_demo_{n}",
                            "name": name,
                            "arguments": step["arguments"],
                            "output": step["output"],
                            "is_error": False,
                            "declined": False,
                        }
                        for n, (name, step) in enumerate(
                            zip(
                                ("check_login", "question", "book_table"),
                                got["steps"],
                                strict=True,
                            ),
                            start=1,
                        )
                    ],
                }
            names = [name for name, _ in stream.seen]
            assert names.count("tool_call") == names.count("tool_result") == 3
            assert names.count("pending") == names.count("answered") == 3
            # A step is reported before the request it raised.
            first_call = next(d for n, d in stream.seen if n == "tool_call")
            assert first_call == {
                "run_id": run_id,
                "id": "serve_demo_1",
                "name": "check_login",
                "arguments": {},
            }
            assert names.index("tool_call") < names.index("pending")
            async with http.get("/requests") as reply:
                assert await reply.json() == {
                    "requests": [],
                    "next": None,
                    "total": 0,
                    "counts": {},
                }


async def all_runs(http: Any) -> list[dict[str, Any]]:
    """Every run ``GET /runs`` lists, page after page."""
    runs: list[dict[str, Any]] = []
    cursor = ""
    while True:
        async with http.get("/runs", params={"limit": "500", "cursor": cursor}) as reply:
            page = await reply.json()
        runs.extend(page["runs"])
        if page["next"] is None:
            return runs
        cursor = page["next"]


async def answer_demo_from(
    http: Any, stream: Events, run_id: str, login: dict[str, Any]
) -> dict[str, Any]:
    """:func:`answer_demo` when the login request was read already."""
    request_id = login["request"]["id"]
    assert await post(http, f"/requests/{request_id}/answer", {"ok": True}) == (
        200,
        {"id": request_id, "ok": True},
    )
    answered = await stream.until("answered", request_id=request_id)
    assert {"request_id": request_id, "ok": True, "run_id": run_id}.items() <= answered.items()
    for body in ({"ok": True, "data": {"answers": ["Sakura", "4"]}}, {"ok": True}):
        pending = await stream.until("pending", run_id=run_id)
        status, _ = await post(http, f"/requests/{pending['request']['id']}/answer", body)
        assert status == 200
    return await stream.until("done", run_id=run_id)


async def test_runs_are_listed_newest_first_and_unknown_ids_are_404():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            ids = []
            for prompt in ("first", "second"):
                ids.append((await post(http, "/runs", {"prompt": prompt}))[1]["id"])
                await stream.until("pending", run_id=ids[-1])
            async with http.get("/runs") as reply:
                listed = (await reply.json())["runs"]
            assert [(r["id"], r["prompt"], r["status"]) for r in listed] == [
                (ids[1], "second", "pending"),
                (ids[0], "first", "pending"),
            ]
            assert all(r["text"] is None and r["error"] is None for r in listed)
            async with http.get("/runs/run_nope") as reply:
                assert reply.status == 404
                assert "run_nope" in (await reply.json())["error"]
            async with http.get("/requests") as reply:
                requests = (await reply.json())["requests"]
            assert [(r["run_id"], r["kind"]) for r in requests] == [
                (ids[0], "authorization"),
                (ids[1], "authorization"),
            ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{}", "'prompt' must be a string"),
        (b'{"prompt": 3}', "'prompt' must be a string"),
        (b'{"prompt": ""}', "must not be empty"),
        (b'{"prompt": "  \\n "}', "must not be empty"),
        (json.dumps({"prompt": "x" * 10_001}).encode(), "longer than 10000"),
        (b'{"prompt": "hi", "model": "gpt"}', "unknown key(s) 'model'"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
async def test_a_malformed_run_is_422(body, message):
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            headers = {"Content-Type": "application/json"}
            async with http.post("/runs", data=body, headers=headers) as reply:
                assert reply.status == 422
                assert message in (await reply.json())["error"]
            async with http.get("/runs") as reply:
                assert await reply.json() == {"runs": [], "next": None, "total": 0, "counts": {}}


async def test_a_run_of_exactly_the_longest_prompt_is_accepted():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            assert (await post(http, "/runs", {"prompt": "é" * 10_000}))[0] == 202


async def test_bodies_over_max_body_are_413_and_non_json_bodies_415():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(max_body=1024)) as http:
            big = {"prompt": "x" * 2000}
            async with http.post("/runs", json=big) as reply:  # Content-Length says it
                assert reply.status == 413
                assert "1024 bytes" in (await reply.json())["error"]

            async def chunks() -> AsyncIterator[bytes]:
                yield json.dumps(big).encode()

            headers = {"Content-Type": "application/json"}
            async with http.post("/runs", data=chunks(), headers=headers) as reply:
                assert reply.status == 413  # no length given: counted while read
                assert "error" in await reply.json()

            async with http.post("/runs", data='{"prompt": "hi"}') as reply:  # text/plain
                assert reply.status == 415
                assert "application/json" in (await reply.json())["error"]
            async with http.post("/requests/r1/answer", data=b'{"ok": true}') as reply:
                assert reply.status == 415
            async with http.get("/runs") as reply:
                assert await reply.json() == {"runs": [], "next": None, "total": 0, "counts": {}}


async def test_unknown_routes_and_methods_answer_json_errors():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            async with http.get("/nowhere") as reply:
                assert reply.status == 404 and "error" in await reply.json()
            async with http.delete("/runs") as reply:
                assert reply.status == 405 and "error" in await reply.json()
                assert "POST" in reply.headers["Allow"]


async def test_answers_404_409_422_and_200():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "go"}))[1]["id"]
            request_id = (await stream.until("pending", run_id=run_id))["request"]["id"]
            path = f"/requests/{request_id}/answer"

            assert (await post(http, "/requests/req_nobody/answer", {"ok": True}))[0] == 404
            for bad, message in [
                ({"ok": "yes"}, "'ok' must be bool"),
                ({}, "missing 'ok'"),
                ({"ok": True, "reason": "declined"}, "ok=True carries no reason"),
                ({"ok": False, "reason": "bored"}, "'reason' must be one of"),
                ({"ok": True, "data": [1]}, "'data' must be dict"),
                ({"ok": True, "id": "req_other"}, "the body names request 'req_other'"),
                ({"ok": True, "extra": 1}, "unknown key(s) 'extra'"),
                ([True], "must be a JSON object"),
            ]:
                status, error = await post(http, path, bad)
                assert (status, message in error["error"]) == (422, True), (bad, error)
            async with http.post(
                path, data=b"{oops", headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 422
            async with http.get("/requests") as reply:  # nothing above changed anything
                assert [r["id"] for r in (await reply.json())["requests"]] == [request_id]

            body = {"id": request_id, "ok": False, "reason": "declined"}
            assert await post(http, path, body) == (200, {"id": request_id, "ok": False})
            assert (await post(http, path, {"ok": True}))[0] == 409  # answered already
            done = await stream.until("done", run_id=run_id)
            assert done["status"] == "done" and "not logged in" in done["text"]
            # Declined, said so, and in words for people: the model's text stays inside.
            assert done["declined"] is True
            assert "declined/expired" not in done["text"]
            async with http.get(f"/runs/{run_id}") as reply:
                run = await reply.json()
            assert run["declined"] is True
            assert [(s["name"], s["is_error"], s["declined"]) for s in run["steps"]] == [
                ("check_login", True, True)
            ]
            assert run["steps"][0]["output"].startswith("declined/expired: ")


def expiring_tool(seconds: float) -> Any:
    @define_tool(name="pay")
    async def pay(ctx: ToolContext | None = None) -> ToolResult:
        """Pay; the approval expires soon."""
        if ctx is None or ctx.answer is None:
            expires = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
            return ToolResult.pending(Request("", "approval", "Pay?", expires_at=expires))
        return ToolResult.ok("paid")

    return pay


def call_then_echo(name: str) -> Any:
    """A model that calls ``name`` once, then answers with the last tool output."""

    def model(messages: list[Any], tools: list[Any]) -> AssistantMessage:
        returns = [m for m in messages if isinstance(m, ToolReturn)]
        if not returns:
            return AssistantMessage(None, (ToolCall("call_1", name, {}),))
        return AssistantMessage(returns[-1].output)

    return model


def app_with(
    model: Any, tools: list[Any], store: Any = None, max_turns: int = 10, **kwargs: Any
) -> web.Application:
    def make_client(inbox: ServeInbox) -> LlmClient:
        return LlmClient.in_process(model, wait_for=inbox, max_turns=max_turns)

    own = MemoryRunStore() if store is None else None
    app = create_app(
        make_client=make_client,
        toolkit=Toolkit.create(builtins=False, extra_tools=tools),
        store=store if own is None else own,
        **{"token": TOKEN, **kwargs},
    )
    return app if own is None else closing(app, own)


async def test_an_expired_request_is_announced_and_then_409():
    with anyio.fail_after(LIMIT):
        app = app_with(call_then_echo("pay"), [expiring_tool(0.05)])
        async with serving(app) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "pay"}))[1]["id"]
            request_id = (await stream.until("pending", run_id=run_id))["request"]["id"]
            answered = await stream.until("answered", request_id=request_id)
            expired = {"request_id": request_id, "ok": False, "reason": "expired"}
            assert expired.items() <= answered.items()
            status, error = await post(http, f"/requests/{request_id}/answer", {"ok": True})
            assert status == 409 and "expired" in error["error"]
            done = await stream.until("done", run_id=run_id)
            assert done["text"] == "declined/expired: Pay?"


async def test_a_failing_run_is_error_and_a_limited_one_incomplete():
    def broken(messages: list[Any], tools: list[Any]) -> AssistantMessage:
        raise RuntimeError("the model fell over")

    with anyio.fail_after(LIMIT):
        async with serving(app_with(broken, [])) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "hi"}))[1]["id"]
            failed = await stream.until("failed", run_id=run_id)
            assert "the model fell over" in failed["message"]
            async with http.get(f"/runs/{run_id}") as reply:
                run = await reply.json()
            assert (run["status"], run["error"], run["text"]) == ("error", failed["message"], None)

    @define_tool
    async def noop() -> str:
        """Does nothing."""
        return "nothing"

    def forever(messages: list[Any], tools: list[Any]) -> AssistantMessage:
        return AssistantMessage("again", (ToolCall(f"c{len(messages)}", "noop", {}),))

    with anyio.fail_after(LIMIT):
        async with serving(app_with(forever, [noop], max_turns=2)) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "loop"}))[1]["id"]
            done = await stream.until("done", run_id=run_id)
            assert done["status"] == "incomplete"
            async with http.get(f"/runs/{run_id}") as reply:
                assert (await reply.json())["status"] == "incomplete"


class WatchedStore(MemoryRunStore):
    """A memory store that says when a run halted into it (spilled)."""

    def __init__(self) -> None:
        super().__init__()
        self.halted: list[str] = []
        self.changed = anyio.Event()

    async def halt(self, run_id: str, owner: str) -> None:
        await super().halt(run_id, owner)
        self.halted.append(run_id)
        self.changed.set()
        self.changed = anyio.Event()


async def test_a_spilled_run_is_listed_and_resumes_when_answered_over_http():
    """park_timeout passes: the run goes to the store, stays listed, and an answer over HTTP
    resumes it; the requests of the resumed run (which has no stream) still show up."""
    with anyio.fail_after(LIMIT):
        async with (
            WatchedStore() as store,
            serving(demo_app(store, park_timeout=0.05)) as http,
            events(http) as stream,
        ):
            run_id = (await post(http, "/runs", {"prompt": "slow"}))[1]["id"]
            login = (await stream.until("pending", run_id=run_id))["request"]
            while not store.halted:
                await store.changed.wait()
            assert store.halted == [run_id]
            async with http.get("/requests") as reply:
                assert (await reply.json())["requests"] == [{**login, "run_id": run_id}]
            async with http.get(f"/runs/{run_id}") as reply:
                assert (await reply.json())["status"] == "pending"

            done = await answer_demo_from(http, stream, run_id, {"request": login})
            assert done["status"] == "done" and "Sakura for 4" in done["text"]
            async with http.get(f"/runs/{run_id}") as reply:
                run = await reply.json()
            assert (run["status"], run["text"]) == ("done", done["text"])
            assert await store.requests() == []


async def test_the_event_stream_sends_keep_alive_comments(monkeypatch):
    monkeypatch.setattr(serve_events, "KEEPALIVE_SECONDS", 0.01)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            while ": keep-alive" not in stream.comments:
                line = (await stream.response.content.readline()).decode().rstrip("\n")
                if line.startswith(":"):
                    stream.comments.append(line)
            assert stream.comments[0] == ": connected"


async def test_a_subscriber_that_never_reads_is_dropped_and_runs_go_on(monkeypatch):
    """A client that opens /events and never reads: once its buffer is full it is dropped
    and disconnected; runs keep starting and parking, and a reading subscriber sees all."""
    monkeypatch.setattr(serve_events, "SUBSCRIBER_BUFFER", 16)
    app = demo_app()
    bus = app[SERVE].bus
    parked: set[str] = set()
    progress = anyio.Event()

    async def read_all(stream: Events) -> None:
        nonlocal progress
        while True:
            name, data = await stream.next()
            if name == "pending":
                parked.add(data["run_id"])
                progress.set()
                progress = anyio.Event()

    with anyio.fail_after(30):
        async with serving(app) as http:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # fills up quickly
            sock.setblocking(False)
            address = (http.server.host, http.server.port)
            await asyncio.get_running_loop().sock_connect(sock, address)
            reader, writer = await asyncio.open_connection(sock=sock)
            try:
                writer.write(
                    b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
                )
                await writer.drain()
                assert await reader.readuntil(b": connected\n\n")  # subscribed; now never read
                async with events(http) as stream, anyio.create_task_group() as tg:
                    tg.start_soon(read_all, stream)
                    assert len(bus) == 2
                    started: list[str] = []
                    while bus.dropped == 0:  # big events fill the socket buffers, then the queue
                        status, run = await post(http, "/runs", {"prompt": "x" * 10_000})
                        assert status == 202
                        started.append(run["id"])
                    assert len(bus) == 1  # only the slow one was dropped
                    while not parked >= set(started):
                        await progress.wait()
                    tg.cancel_scope.cancel()
                runs = await all_runs(http)
                assert [r["id"] for r in runs] == started[::-1]
                assert {r["status"] for r in runs} == {"pending"}
                # The dropped client finds its connection closed after what was sent.
                try:
                    while await reader.read(1 << 16):
                        pass
                except ConnectionResetError:
                    pass
            finally:
                writer.close()
                try:
                    await writer.wait_closed()
                except ConnectionResetError:
                    pass


async def test_the_bus_drops_a_full_subscriber_without_blocking_and_ends_the_rest():
    bus = serve_events.EventBus(buffer=2)
    slow, idle = bus.subscribe(), bus.subscribe()
    for n in range(2):
        bus.publish("tick", {"n": n})
    assert await idle.receive.receive() == b'event: tick\ndata: {"n":0}\n\n'
    bus.publish("tick", {"n": 2})  # slow is full: dropped, idle had room
    assert (len(bus), bus.dropped, slow.dropped, idle.dropped) == (1, 1, True, False)
    assert slow.scope.cancel_called
    bus.close()
    assert [await idle.receive.receive() for _ in range(2)] == [
        b'event: tick\ndata: {"n":1}\n\n',
        b'event: tick\ndata: {"n":2}\n\n',
    ]
    with pytest.raises(anyio.EndOfStream):
        await idle.receive.receive()
    late = bus.subscribe()  # after close: an empty stream
    with pytest.raises(anyio.EndOfStream):
        await late.receive.receive()
    bus.publish("tick", {"n": 3})  # nobody left: a no-op
    for sub in (slow, idle, late):
        sub.receive.close()


async def test_shutdown_ends_open_event_streams():
    """A browser tab left open must not hold the shutdown up (aiohttp would wait 60 s)."""
    with anyio.fail_after(LIMIT):
        async with aiohttp.ClientSession(headers=AUTH) as session:
            server = GuardedTestServer(demo_app())
            await server.start_server()
            async with session.get(server.make_url("/events")) as response:
                assert await response.content.readline() == b": connected\n"
                await server.close()
                assert await response.content.read() == b"\n"  # the end of the stream
        assert_no_leaks()


async def test_metrics_are_prometheus_text():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "count me"}))[1]["id"]
            await stream.until("pending", run_id=run_id)
            async with http.get("/metrics") as reply:
                assert reply.status == 200
                assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                text = await reply.text()
            assert "# TYPE toolnexus_llm_requests_total counter" in text
            assert 'toolnexus_llm_requests_total{model="serve-demo",status="ok"} 1' in text
            assert 'toolnexus_tool_calls_total{tool="check_login"' in text


async def test_openapi_json_describes_every_route():
    app = demo_app()
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    with anyio.fail_after(LIMIT):
        async with serving(app) as http:
            async with http.get("/openapi.json") as reply:
                assert reply.status == 200
                assert reply.headers["Content-Type"].startswith("application/json")
                spec = await reply.json()
    assert spec["openapi"].startswith("3.1")
    described = {
        (path, method)
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert described == routes
    statuses = {
        (path, method): set(op["responses"])
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in ("get", "post")
    }
    assert statuses[("/runs", "post")] >= {"202", "413", "415", "422"}
    assert statuses[("/requests/{id}/answer", "post")] >= {"200", "404", "409", "413", "422"}
    assert statuses[("/runs/{id}", "get")] == {"200", "401", "403", "404", "503"}
    # The lock: every operation but the two probes and the sign-in callback names its token
    # and its 401 and 403 refusals; those need no token, and say so.
    probes = {("/healthz", "get"), ("/readyz", "get"), ("/oauth/callback", "get")}
    assert all({"401", "403"} <= codes for op, codes in statuses.items() if op not in probes)
    assert all(spec["paths"][path][method]["security"] == [] for path, method in probes)
    assert statuses[("/healthz", "get")] == {"200", "403"}
    assert statuses[("/readyz", "get")] == {"200", "403", "503"}
    assert statuses[("/oauth/callback", "get")] == {"200", "400", "403", "404", "409", "503"}
    for route in (("/runs", "post"), ("/requests", "get"), ("/requests/{id}/answer", "post")):
        assert {"500", "503"} <= statuses[route], route  # the store failed, or is down
    assert statuses[("/", "get")] >= {"200", "303"}
    assert statuses[("/runs", "post")] >= {"408"}
    assert spec["security"] == [{"bearer": []}, {"cookie": []}]
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    refs = json.dumps(spec).count('"$ref"')
    components = spec["components"]
    for ref in _refs(spec):
        _, _, kind, name = ref.split("/")
        assert name in components[kind], ref
    assert refs


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [
            r for v in node.values() for r in _refs(v)
        ]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


async def test_the_page_and_its_files_are_served_and_nothing_else(monkeypatch, tmp_path: Path):
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><title>inbox</title>")
    (static / "app.js").write_text("console.log('hi');")
    (static / ".secret").write_text("no")
    (tmp_path / "outside.txt").write_text("no")
    monkeypatch.setattr(serve_app, "STATIC_DIR", static)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            async with http.get("/") as reply:
                assert reply.status == 200
                assert reply.content_type == "text/html"
                assert "<title>inbox</title>" in await reply.text()
            async with http.get("/static/app.js") as reply:
                assert reply.status == 200
                assert reply.content_type in ("text/javascript", "application/javascript")
            for path in (
                "/static/missing.css",
                "/static/.secret",
                "/static/..%2Foutside.txt",
                "/static/%2e%2e%2foutside.txt",
                "/static/../outside.txt",
                "/static/",
                "/outside.txt",
            ):
                async with http.get(path) as reply:
                    assert reply.status == 404, path

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(serve_app, "STATIC_DIR", empty)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            async with http.get("/") as reply:
                assert reply.status == 404


async def test_the_client_must_park_in_the_apps_inbox():
    def stray(inbox: ServeInbox) -> LlmClient:
        return demo_client(ServeInbox(1.0))

    app = create_app(
        make_client=stray,
        toolkit=Toolkit.create(builtins=False, extra_tools=serve_demo_tools()),
        store=MemoryRunStore(),
        token=TOKEN,
    )
    with anyio.fail_after(LIMIT):
        server = TestServer(app)
        with pytest.raises(UsageError, match="wait_for"):
            await server.start_server()
        await server.close()
    with pytest.raises(UsageError):
        demo_app(park_timeout=0)
    with pytest.raises(UsageError):
        demo_app(max_body=0)
    for lease in (0, -5, float("nan")):  # checked here, not later inside the running host
        with pytest.raises(UsageError, match="lease must be > 0"):
            demo_app(lease=lease)


class BreakableStore(WatchedStore):
    """A memory store whose stored runs can be made unreadable, as a damaged file's are."""

    broken = False

    async def load(self, run_id: str) -> StoredRun:
        if self.broken:
            raise StoreError(f"stored run {run_id!r} cannot be read")
        return await super().load(run_id)

    async def claim(
        self, run_id: str, owner: str, lease_until: float, now: float
    ) -> StoredRun | None:
        if self.broken:
            raise StoreError(f"stored run {run_id!r} cannot be read")
        return await super().claim(run_id, owner, lease_until, now)


async def test_an_answer_to_an_unreadable_run_is_kept_and_the_run_goes_on_once_repaired():
    """The answer is taken (200) even though the run cannot be read back right now: nothing
    the person said is lost, and once the store is repaired the run goes on with it,
    without asking that question again."""
    with anyio.fail_after(LIMIT):
        async with (
            BreakableStore() as store,
            serving(demo_app(store, park_timeout=0.05)) as http,
            events(http) as stream,
        ):
            run_id = (await post(http, "/runs", {"prompt": "doomed"}))[1]["id"]
            login = (await stream.until("pending", run_id=run_id))["request"]
            while not store.halted:
                await store.changed.wait()
            store.broken = True
            status, body = await post(http, f"/requests/{login['id']}/answer", {"ok": True})
            assert (status, body) == (200, {"id": login["id"], "ok": True})
            status, error = await post(http, f"/requests/{login['id']}/answer", {"ok": True})
            assert status == 409 and "answered already" in error["error"]

            store.broken = False  # repaired: the run goes on with the answer it was given
            question = (await stream.until("pending", run_id=run_id))["request"]
            assert question["kind"] == "question"  # the next step: the login is not asked again
            answers = {"ok": True, "data": {"answers": ["Sakura", "4"]}}
            assert (await post(http, f"/requests/{question['id']}/answer", answers))[0] == 200
            approval = (await stream.until("pending", run_id=run_id))["request"]
            assert (await post(http, f"/requests/{approval['id']}/answer", {"ok": True}))[0] == 200
            done = await stream.until("done", run_id=run_id)
            assert done["status"] == "done"


async def test_the_demo_books_the_restaurant_the_prompt_names():
    """A prompt naming a demo restaurant: only the party size is asked, and it is booked."""
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "Dinner at le petit zinc"}))[1]["id"]
            login = (await stream.until("pending", run_id=run_id))["request"]
            assert (await post(http, f"/requests/{login['id']}/answer", {"ok": True}))[0] == 200
            question = (await stream.until("pending", run_id=run_id))["request"]
            asked = [q["question"] for q in question["data"]["questions"]]
            assert asked == ["For how many people?"]
            body = {"ok": True, "data": {"answers": ["6"]}}
            assert (await post(http, f"/requests/{question['id']}/answer", body))[0] == 200
            approval = (await stream.until("pending", run_id=run_id))["request"]
            assert approval["data"] == {"amount_eur": 60, "to": "Le Petit Zinc", "party_size": 6}
            body = {"ok": False, "reason": "declined"}
            assert (await post(http, f"/requests/{approval['id']}/answer", body))[0] == 200
            done = await stream.until("done", run_id=run_id)
            assert done["declined"] is True
            assert done["text"] == (
                "You asked: 'Dinner at le petit zinc'. You chose Le Petit Zinc for 6, "
                "but I did not book it: you declined the deposit."
            )
