"""The inbox under hostile or broken input: bodies, event encoding, slow clients, logs.

Bodies nested 10,000 deep, lone surrogates and unexpected exceptions must be answered in
JSON and change nothing; a run's report that UTF-8 cannot encode must not stop it. Slow
clients (half a request line, nothing at all, a trickled body, an idle keep-alive
connection) are let go after a bounded time, while a long-lived ``GET /events`` goes on.
The token never reaches a log. Raw sockets stand for the slow clients; every wait
is for the server to act (an event, a reply, an EOF), under ``anyio.fail_after``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp.web_log import AccessLogger

from tests.conftest import assert_no_leaks
from tests.test_serve_api import (
    AUTH,
    LIMIT,
    TOKEN,
    app_with,
    demo_app,
    events,
    post,
    serving,
)
from toolnexus_async import Answer, AssistantMessage
from toolnexus_async.durable import MemoryRunStore, SqliteRunStore
from toolnexus_async.serve import _bodies as serve_bodies
from toolnexus_async.serve import _events as serve_events
from toolnexus_async.serve import _routes as serve_routes
from toolnexus_async.serve import run_server
from toolnexus_async.serve.demo import serve_demo_app

JSON = {"Content-Type": "application/json"}


async def raw_post(http: Any, path: str, body: bytes) -> tuple[int, Any]:
    async with http.post(path, data=body, headers=JSON) as reply:
        return reply.status, await reply.json()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_deep_json_is_422_json_and_nothing_is_recorded():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            for path in ("/runs", "/requests/req_x/answer"):
                for body in (
                    b'{"prompt": ' + nested(10_000) + b"}",
                    nested(30_000),  # just under max_body
                    b'{"a":' * 65 + b"1" + b"}" * 65,
                ):
                    status, error = await raw_post(http, path, body)
                    assert (status, error) == (
                        422,
                        {"error": "the body is nested deeper than 64 levels"},
                    )
            # 64 levels parse (and are then refused for what they hold, not for depth).
            status, error = await raw_post(http, "/runs", b'{"prompt": ' + nested(63) + b"}")
            assert (status, error) == (422, {"error": "'prompt' must be a string"})
            # Brackets inside a string are text, however many.
            status, run = await raw_post(
                http, "/runs", json.dumps({"prompt": "[{" * 5000}).encode()
            )
            assert status == 202
            assert (await stream.until("run_started"))["run_id"] == run["id"]
            async with http.get("/runs") as reply:
                assert [r["id"] for r in (await reply.json())["runs"]] == [run["id"]]


async def test_a_lone_surrogate_is_422_no_run_is_recorded_and_the_stream_goes_on():
    """The JSON text ``"a \\ud800"`` is valid JSON but not text: refused before a run exists,
    with an event-stream client connected (which used to turn it into a 500 and a run left
    ``running`` forever)."""
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            for body in (
                rb'{"prompt": "a \ud800"}',
                rb'{"prompt": "a \udfff b"}',
                rb'{"prompt": "\ude00\ud83d"}',  # a pair in the wrong order is two lone ones
                rb'{"prompt": "ok", "\ud800": 1}',
            ):
                status, error = await raw_post(http, "/runs", body)
                assert status == 422 and "lone surrogate" in error["error"], body
            async with http.get("/runs") as reply:
                assert (await reply.json())["runs"] == []

            # A real pair is one character, and fine; the stream's next event is its run.
            status, run = await raw_post(http, "/runs", rb'{"prompt": "dinner \ud83c\udf5d"}')
            assert status == 202
            assert await stream.next() == (
                "run_started",
                {"run_id": run["id"], "prompt": "dinner 🍝"},
            )
            request = (await stream.until("pending", run_id=run["id"]))["request"]

            path = f"/requests/{request['id']}/answer"
            for body in (
                rb'{"ok": true, "data": {"name": "\udbff"}}',
                rb'{"ok": true, "data": {"\udbff": 1}}',
            ):
                status, error = await raw_post(http, path, body)
                assert status == 422 and "lone surrogate" in error["error"]
            async with http.get("/requests") as reply:  # still waiting for a real answer
                assert [r["id"] for r in (await reply.json())["requests"]] == [request["id"]]


async def test_nan_and_infinity_are_not_json():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            for constant in (b"NaN", b"Infinity", b"-Infinity"):
                status, error = await raw_post(http, "/runs", b'{"prompt": ' + constant + b"}")
                assert status == 422 and "is not JSON" in error["error"]


async def test_a_number_too_large_for_a_double_is_not_json():
    """1e999 would be Infinity once parsed: refused like the word, and nothing is taken."""
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            for number in (b"1e999", b"-1e999", b"1.5e400"):
                body = b'{"prompt": "a", "x": ' + number + b"}"
                status, error = await raw_post(http, "/runs", body)
                assert status == 422 and "too large for a double" in error["error"], number
            status, run = await raw_post(http, "/runs", b'{"prompt": "dinner"}')
            assert status == 202
            request = (await stream.until("pending", run_id=run["id"]))["request"]
            path = f"/requests/{request['id']}/answer"
            status, error = await raw_post(http, path, b'{"ok": true, "data": {"n": [1e999]}}')
            assert status == 422 and "too large for a double" in error["error"]
            async with http.get("/requests") as reply:  # still waiting for a real answer
                assert [r["id"] for r in (await reply.json())["requests"]] == [request["id"]]


class AskedStore(MemoryRunStore):
    """A memory store that records the request ids it was asked to take an answer for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def accept(
        self, answer: Answer, now: float, *, delivered: bool = False, by: str | None = None
    ) -> Any:
        self.asked.append(answer.id)
        return await super().accept(answer, now, delivered=delivered, by=by)


async def test_nul_is_not_text_in_a_body_or_a_request_id():
    """U+0000 is valid JSON but no store keeps it as text (PostgreSQL refuses it): 422 in a
    body, before a run exists; 404 in a request id, before the store is asked (a memory
    store would say 404 itself, PostgreSQL a 500)."""
    with anyio.fail_after(LIMIT):
        async with AskedStore() as store, serving(demo_app(store)) as http:
            for body in (rb'{"prompt": "Dinner\u0000 for two"}', rb'{"prompt": "ok", "\u0000": 1}'):
                status, error = await raw_post(http, "/runs", body)
                assert status == 422 and "U+0000" in error["error"], body
            async with http.get("/runs") as reply:
                assert (await reply.json())["runs"] == []
            status, error = await raw_post(http, "/requests/req_%00x/answer", b'{"ok": true}')
            assert (status, error) == (404, {"error": "no run waits for request 'req_\\x00x'"})
            assert store.asked == []
            # Bytes that are not UTF-8 stay as written (no lone surrogate): one more unknown id.
            status, error = await raw_post(http, "/requests/req_%ED%A0%80/answer", b'{"ok": true}')
            assert (status, error) == (404, {"error": "no run waits for request 'req_%ED%A0%80'"})


async def test_a_run_that_reports_unencodable_text_still_ends():
    """A model's text with a lone surrogate reaches the stream as a JSON escape; the run
    ends ``done`` instead of failing (or hanging) on its own report."""

    def model(messages: list[Any], tools: list[Any]) -> AssistantMessage:
        return AssistantMessage("half a pair: \ud800")

    with anyio.fail_after(LIMIT):
        async with serving(app_with(model, [])) as http, events(http) as stream:
            run_id = (await post(http, "/runs", {"prompt": "go"}))[1]["id"]
            done = await stream.until("done", run_id=run_id)
            assert (done["status"], done["text"]) == ("done", "half a pair: \ud800")
            async with http.get(f"/runs/{run_id}") as reply:
                assert (await reply.json())["status"] == "done"


async def test_the_bus_never_raises_on_publish(caplog: pytest.LogCaptureFixture):
    bus = serve_events.EventBus()
    sub = bus.subscribe()
    bus.publish("odd", {"text": "\udc80"})
    bus.publish("broken", {"not json": {1, 2}})  # a set: skipped, logged
    circular: dict[str, Any] = {}
    circular["self"] = circular
    bus.publish("broken", circular)
    bus.publish("fine", {"n": 1})
    assert await sub.receive.receive() == b'event: odd\ndata: {"text":"\\udc80"}\n\n'
    assert await sub.receive.receive() == b'event: fine\ndata: {"n":1}\n\n'
    assert [r.getMessage() for r in caplog.records] == [
        "skipped a 'broken' event that cannot be encoded"
    ] * 2
    bus.close()
    sub.receive.close()


async def test_an_unexpected_exception_is_a_json_500(monkeypatch, caplog):
    def boom(params: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(serve_routes, "run_query", boom)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            async with http.get("/runs") as reply:
                assert reply.status == 500
                assert await reply.json() == {"error": "internal server error"}
                assert reply.headers["X-Content-Type-Options"] == "nosniff"
            async with http.get("/requests") as reply:  # the server goes on
                assert reply.status == 200
    assert "unexpected error answering GET /runs" in caplog.text


# -- slow clients -----------------------------------------------------------------------------


async def connect(http: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(http.server.host, http.server.port)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection.

    A reset counts as closed: a server that hangs up before it has read all the client
    sent (half a request line, on a loaded machine) makes the kernel send RST, not FIN.
    """
    received = b""
    try:
        while chunk := await reader.read(1 << 16):
            received += chunk
    except ConnectionResetError:
        pass
    return received


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass


def request_head(path: str = "/runs", *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {TOKEN}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_trickled_body_is_408_and_the_connection_closed(monkeypatch):
    monkeypatch.setattr(serve_bodies, "BODY_TIMEOUT", 0.2)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            reader, writer = await connect(http)
            head = request_head("/runs", "Content-Type: application/json", "Content-Length: 100")
            writer.write(head.replace(b"GET", b"POST", 1) + b'{"prompt": ')
            await writer.drain()
            reply = await until_closed(reader)
            assert reply.startswith(b"HTTP/1.1 408")
            assert reply.endswith(
                b'{"error": "the request body did not arrive within 0.2 seconds"}'
            )
            await close(writer)
            async with http.get("/runs") as listed:
                assert (await listed.json())["runs"] == []


async def test_half_a_request_line_or_nothing_is_disconnected_after_the_header_timeout():
    timeout = 0.3
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), header_timeout=timeout) as http:
            started = anyio.current_time()
            clients = [await connect(http) for _ in range(100)]
            try:
                for n, (_, writer) in enumerate(clients):
                    if n % 2:  # half of them send half a request line, the others nothing
                        writer.write(b"GET /requ")
                        await writer.drain()
                for reader, writer in clients:
                    assert await until_closed(reader) == b""
                    if writer is clients[0][1]:  # the first to go, at its deadline
                        assert anyio.current_time() - started >= timeout * 0.8
            finally:  # also on failure: an open socket here would fail the next test
                for _, writer in clients:
                    await close(writer)
            # Each one let go after the timeout (plenty of slack for a busy machine).
            assert anyio.current_time() - started < timeout + 3

            # A client that sends its head in time is answered, and may ask again.
            reader, writer = await connect(http)
            writer.write(request_head())
            await writer.drain()
            assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
            await close(writer)


async def test_an_idle_keep_alive_connection_is_closed():
    idle = 0.3
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), idle_timeout=idle, header_timeout=30) as http:
            reader, writer = await connect(http)
            for _ in range(2):  # kept alive: a second request on the same connection
                writer.write(request_head())
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                length = int(next(
                    line.split(b":")[1] for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ))  # fmt: skip
                assert json.loads(await reader.readexactly(length))["runs"] == []
            # Idle now: the server hangs up, long before the 30 s header timeout (LIMIT).
            assert await until_closed(reader) == b""
            await close(writer)


async def test_the_event_stream_outlives_both_timeouts(monkeypatch):
    monkeypatch.setattr(serve_events, "KEEPALIVE_SECONDS", 0.05)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), header_timeout=0.2, idle_timeout=0.2) as http:
            async with events(http) as stream:
                opened = anyio.current_time()
                while anyio.current_time() - opened < 0.8:  # four times either timeout
                    line = await stream.response.content.readline()
                    assert line, "the event stream was closed"
                run_id = (await post(http, "/runs", {"prompt": "still there?"}))[1]["id"]
                assert (await stream.until("run_started"))["run_id"] == run_id


async def test_a_malformed_request_is_a_json_400_with_the_headers():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            reader, writer = await connect(http)
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n")
            await writer.drain()
            reply = await until_closed(reader)
            await close(writer)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert b"X-Frame-Options: DENY" in head and b"X-Content-Type-Options: nosniff" in head
    assert json.loads(body) == {"error": "Bad Request"}


# -- logs ---------------------------------------------------------------------------------------


async def log_in_and_about(http: Any) -> None:
    """What a browser does with the printed URL, plus mistakes that quote the token."""
    async with http.get("/", params={"token": TOKEN}) as reply:
        assert reply.status == 200
    for path in ("/requests", "/static/app.js", "/events?token=" + TOKEN):
        async with http.get(path) as reply:
            assert reply.status == 200
            if path.startswith("/events"):
                break  # open is enough
    async with http.get("/", params={"token": TOKEN + "x"}) as reply:
        assert reply.status == 401
    reader, writer = await connect(http)
    writer.write(f"GET /?token={TOKEN} HTTP/1.1 and then nonsense\r\n\r\n".encode())
    await writer.drain()
    assert b" 400 Bad Request\r\n" in await until_closed(reader)
    await close(writer)


async def test_the_token_never_reaches_a_log(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            await log_in_and_about(http)
    access = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert any('"GET /" 303' in line for line in access), access  # the access log did run
    assert any('"GET /requests" 200' in line for line in access), access
    assert TOKEN not in caplog.text
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


async def test_aiohttps_own_access_log_would_show_it(caplog: pytest.LogCaptureFixture):
    """Why the runner brings its own access log: aiohttp's prints the query string."""
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None, access_log_class=AccessLogger) as http:
            async with http.get("/", params={"token": TOKEN}) as reply:
                assert reply.status == 200
    assert TOKEN in caplog.text


# -- run_server ---------------------------------------------------------------------------------


async def test_run_server_serves_until_stopped_and_saves_what_is_parked(tmp_path):
    """``run_server`` (what the CLI runs) listens, reports its URL, and on stop shuts the app
    down in its own task: the parked run is saved, nothing is left running."""
    path = tmp_path / "runs.sqlite"
    urls: list[str] = []
    ready, stop = anyio.Event(), anyio.Event()

    def on_ready(url: str) -> None:
        urls.append(url)
        ready.set()

    app = serve_demo_app(path, token=TOKEN)
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_server(app, port=0, on_ready=on_ready, stop=stop))
            await ready.wait()
            assert urls[0].startswith("http://127.0.0.1:")
            async with aiohttp.ClientSession(urls[0], headers=AUTH) as session:
                async with session.get("/events") as stream:
                    async with session.post("/runs", json={"prompt": "park me"}) as reply:
                        assert reply.status == 202
                    async for line in stream.content:
                        if line.startswith(b"event: pending"):
                            break
                stop.set()
    assert_no_leaks()
    async with SqliteRunStore(path) as saved:
        assert [r.kind for r in await saved.requests()] == ["authorization"]
