"""http_tool against a real aiohttp server on 127.0.0.1: routing, results, secrets, sessions."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from aiohttp import web

from tests.shared import every_path
from toolnexus_async import Tool, ToolResult, UsageError
from toolnexus_async.tools._egress import EgressPolicy
from toolnexus_async.tools._session import SharedSession
from toolnexus_async.tools.http import HttpTool, http_tool

SECRET = "sk-test-5f1c9e0a7b3d"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user": {"type": "string"},
        "item": {"type": "integer"},
        "q": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "flag": {"type": "boolean"},
        "body": {"type": "string"},
    },
}


class Seen:
    """One request as the server received it."""

    def __init__(self, request: web.Request, raw: bytes) -> None:
        self.method = request.method
        self.raw_path = request.raw_path
        self.path = request.path
        self.query = list(request.query.items())
        self.headers = dict(request.headers)
        self.raw = raw


class Server:
    """Echoes what it received (as JSON) unless the path asks for something else."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: list[Seen] = []
        self.peers: set[object] = set()
        # Never set during a test: a handler awaiting it hangs until teardown releases it.
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen = Seen(request, raw)
        self.seen.append(seen)
        assert request.transport is not None
        self.peers.add(request.transport.get_extra_info("peername"))
        echo = {
            "method": seen.method,
            "query": seen.query,
            "headers": seen.headers,
            "body": raw.decode(),
        }
        if request.path.startswith("/status/"):
            status = int(request.path.rsplit("/", 1)[1])
            return web.json_response(echo, status=status)
        if request.path == "/long-error":
            return web.Response(status=500, text="E" * 10_000)
        if request.path == "/bad-token":
            token = request.headers.get("Authorization", "").rsplit(" ", 1)[-1]
            return web.Response(status=403, text=f"invalid token {token}")
        if request.path == "/latin1":
            return web.Response(
                body="café".encode("latin-1"), content_type="text/plain", charset="latin-1"
            )
        if request.path == "/text":
            return web.Response(text="plain words")
        if request.path == "/hang":
            await self.release.wait()
        return web.json_response(echo)

    @property
    def last(self) -> Seen:
        return self.seen[-1]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    async with every_path(srv.handle, srv.release.set) as srv.url:
        yield srv


@pytest.fixture
async def shared() -> AsyncIterator[SharedSession]:
    session = SharedSession()
    try:
        yield session
    finally:
        await session.aclose()


# The test servers listen on loopback, which an http tool refuses unless it is allowed.
LOOPBACK = ["127.0.0.1"]


def make(url: str, shared: SharedSession, **options: Any) -> HttpTool:
    options.setdefault("method", "POST")
    options.setdefault("allow_hosts", LOOPBACK)
    return http_tool(
        "api", "Call the test API.", url=url, input_schema=SCHEMA, session=shared, **options
    )


async def call(tool: HttpTool, args: dict[str, Any]) -> ToolResult:
    # Bounded, so a regression that hangs fails the test instead of the run.
    with anyio.fail_after(10):
        return await tool.execute(args)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_is_an_http_tool(server: Server, shared: SharedSession) -> None:
    """http_tool builds a Tool with source "http" and the given schema."""
    tool = make(server.url + "/x", shared)
    assert isinstance(tool, Tool)
    assert (tool.name, tool.source, tool.input_schema) == ("api", "http", SCHEMA)


async def test_placeholders_are_quoted_and_left_out_of_the_body(
    server: Server, shared: SharedSession
) -> None:
    """{user} and {item} fill the path, URL-quoted; the body keeps only the other arguments."""
    tool = make(server.url + "/users/{user}/items/{item}", shared)
    result = await call(tool, {"user": "a b/c?", "item": 7, "name": "n"})
    assert not result.is_error, result.output
    assert server.last.raw_path == "/users/a%20b%2Fc%3F/items/7"
    assert json.loads(server.last.raw) == {"name": "n"}


async def test_a_missing_placeholder_is_an_error(server: Server, shared: SharedSession) -> None:
    """A URL argument that is absent gives an error result naming it, and no request."""
    tool = make(server.url + "/users/{user}", shared)
    result = await call(tool, {"name": "n"})
    assert result.is_error and "'user'" in result.output
    assert server.seen == []


async def test_query_arguments_go_to_the_query_string(
    server: Server, shared: SharedSession
) -> None:
    """Names in query= go to the query string (a list repeats), merged with the URL's own."""
    tool = make(server.url + "/search?v=1", shared, method="GET", query=("q", "tags", "flag"))
    result = await call(tool, {"q": "fish & chips", "tags": ["a", "b"], "flag": True})
    assert not result.is_error, result.output
    assert server.last.method == "GET"
    assert server.last.query == [
        ("v", "1"),
        ("q", "fish & chips"),
        ("tags", "a"),
        ("tags", "b"),
        ("flag", "true"),
    ]
    assert server.last.raw == b""  # nothing left for a body


async def test_json_body(server: Server, shared: SharedSession) -> None:
    """body="json" sends the remaining arguments as a JSON object."""
    tool = make(server.url + "/items", shared, query=("q",))
    await call(tool, {"q": "x", "name": "widget", "count": 3})
    assert server.last.headers["Content-Type"].startswith("application/json")
    assert json.loads(server.last.raw) == {"name": "widget", "count": 3}


async def test_form_body(server: Server, shared: SharedSession) -> None:
    """body="form" sends the remaining arguments url-encoded, JSON-style scalars."""
    tool = make(server.url + "/form", shared, body="form")
    await call(tool, {"name": "a&b", "count": 2, "flag": False})
    assert server.last.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert server.last.raw == b"name=a%26b&count=2&flag=false"


async def test_raw_body(server: Server, shared: SharedSession) -> None:
    """body="raw" sends the "body" argument as is, with the Content-Type the headers give."""
    tool = make(server.url + "/raw", shared, body="raw", headers={"Content-Type": "text/csv"})
    await call(tool, {"body": "a,b\n1,2\n"})
    assert server.last.raw == b"a,b\n1,2\n"
    assert server.last.headers["Content-Type"] == "text/csv"


async def test_result_modes(server: Server, shared: SharedSession) -> None:
    """text returns the body, json pretty-prints it, status+text puts the status first."""
    text = await call(make(server.url + "/text", shared, result="text"), {})
    assert text.output == "plain words"
    assert text.metadata == {"status": 200}
    pretty = await call(make(server.url + "/status/201", shared, result="json"), {"name": "n"})
    assert pretty.output.startswith('{\n  "method": "POST",')
    assert json.loads(pretty.output)["body"] == '{"name": "n"}'
    assert pretty.metadata == {"status": 201}
    both = await call(make(server.url + "/text", shared, result="status+text"), {})
    assert both.output == "200\nplain words"


async def test_json_result_that_is_not_json_is_an_error(
    server: Server, shared: SharedSession
) -> None:
    """result="json" with a non-JSON reply is an error result, not an exception."""
    result = await call(make(server.url + "/text", shared, result="json"), {})
    assert result.is_error and "not JSON" in result.output


async def test_non_2xx_is_http_status_and_excerpt(server: Server, shared: SharedSession) -> None:
    """A 404 is the error result "HTTP 404: <body>", with the status in the metadata."""
    result = await call(make(server.url + "/status/404", shared), {"name": "n"})
    assert result.is_error
    assert result.output.startswith('HTTP 404: {"method": "POST"')
    assert result.metadata == {"status": 404}


async def test_error_excerpt_is_bounded(server: Server, shared: SharedSession) -> None:
    """A 10 kB error body is cut to a 500-character excerpt."""
    result = await call(make(server.url + "/long-error", shared), {})
    assert result.output == "HTTP 500: " + "E" * 500 + "..."


async def test_env_header_reaches_the_server_but_never_shows(
    server: Server, shared: SharedSession, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """${VAR} is expanded at call time; the value is absent from repr, results and logs."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TN_TEST_TOKEN", SECRET)
    tool = make(
        server.url + "/status/{count}", shared, headers={"Authorization": "Bearer ${TN_TEST_TOKEN}"}
    )
    ok = await call(tool, {"count": 200})
    failed = await call(tool, {"count": 401})
    refused = await call(
        make(
            f"http://127.0.0.1:{free_port()}/",
            shared,
            headers={"Authorization": "Bearer ${TN_TEST_TOKEN}"},
        ),
        {},
    )
    assert [seen.headers["Authorization"] for seen in server.seen] == [f"Bearer {SECRET}"] * 2
    # The server echoes the header back: the model must see it redacted, never the value.
    assert '"Authorization": "[redacted]"' in ok.output
    assert failed.is_error and '"Authorization": "[redacted]"' in failed.output
    assert refused.is_error
    # The variable's value alone (not the whole header) is scrubbed too.
    checker = make(
        server.url + "/bad-token", shared, headers={"Authorization": "Bearer ${TN_TEST_TOKEN}"}
    )
    bad_token = await call(checker, {})
    assert bad_token.output == "HTTP 403: invalid token [redacted]"
    texts = (ok.output, failed.output, refused.output, bad_token.output, repr(tool))
    for text in (*texts, str(tool.__dict__)):
        assert SECRET not in text
    assert caplog.records, "the tool logs its calls at DEBUG"
    for record in caplog.records:
        assert SECRET not in record.getMessage()


async def test_env_is_read_at_call_time(
    server: Server, shared: SharedSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change of the variable after the tool is built is what the next call sends."""
    monkeypatch.setenv("TN_TEST_TOKEN", "first")
    tool = make(server.url + "/x", shared, headers={"X-Key": "${TN_TEST_TOKEN}"})
    await call(tool, {})
    monkeypatch.setenv("TN_TEST_TOKEN", "second")
    await call(tool, {})
    assert [seen.headers["X-Key"] for seen in server.seen] == ["first", "second"]


async def test_missing_env_variable_is_an_error_naming_it(
    server: Server, shared: SharedSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset ${VAR} gives an error result that names the variable, and sends nothing."""
    monkeypatch.delenv("TN_TEST_UNSET", raising=False)
    tool = make(server.url + "/x", shared, headers={"Authorization": "Bearer ${TN_TEST_UNSET}"})
    result = await call(tool, {})
    assert result.is_error
    assert "TN_TEST_UNSET" in result.output and "not set" in result.output
    assert server.seen == []


async def test_usage_errors_never_show_header_values() -> None:
    """Building a tool wrongly raises UsageError; no header value appears in the message."""
    headers = {"Authorization": f"Bearer {SECRET}"}
    cases: list[dict[str, Any]] = [
        {"method": "FETCH"},
        {"url": "ftp://127.0.0.1/x"},
        {"url": "http://127.0.0.1/{nope}"},
        {"query": ("nope",)},
        {"body": "xml"},
        {"result": "html"},
        {"timeout": 0},
        {"headers": {**headers, "X-Bad": 5}},
        {"allow_hosts": ["http://127.0.0.1:8080"]},
        {"max_redirects": -1},
    ]
    for case in cases:
        options: dict[str, Any] = {
            "method": "GET",
            "url": "http://127.0.0.1/x",
            "headers": headers,
            **case,
        }
        with pytest.raises(UsageError) as info:
            http_tool("api", "d", input_schema=SCHEMA, **options)
        assert SECRET not in str(info.value), case


async def test_connection_refused_is_an_error_result(shared: SharedSession) -> None:
    """A refused connection is an error result naming the method and URL."""
    url = f"http://127.0.0.1:{free_port()}/x"
    result = await call(make(url, shared), {})
    assert result.is_error
    assert result.output.startswith(f"api: POST {url} failed: ClientConnectorError")


async def test_timeout_is_an_error_result(server: Server, shared: SharedSession) -> None:
    """A reply that never comes gives an error result once the tool's timeout passes."""
    result = await call(make(server.url + "/hang", shared, timeout=0.2), {})
    assert result.is_error and "timed out after 0.2 s" in result.output


async def test_arguments_that_are_not_an_object(shared: SharedSession) -> None:
    """Called directly with a non-dict, the tool answers with an error result."""
    tool = make("http://127.0.0.1:9/x", shared)
    bad: Any = ["not", "a", "dict"]
    result = await tool.execute(bad)
    assert result.is_error and "must be an object" in result.output


async def test_one_session_serves_every_call(server: Server) -> None:
    """Sequential calls reuse one pooled connection of one session."""
    tool = http_tool("api", "d", "GET", server.url + "/x", SCHEMA, allow_hosts=LOOPBACK)
    try:
        for _ in range(3):
            assert not (await call(tool, {})).is_error
        assert len(server.seen) == 3
        assert len(server.peers) == 1
    finally:
        await tool.aclose()


async def test_tools_sharing_a_session_share_its_pool(server: Server) -> None:
    """Two tools borrowing one SharedSession use the same session object and connection."""
    shared = SharedSession()
    try:
        first = make(server.url + "/a", shared)
        second = make(server.url + "/b", shared)
        await call(first, {})
        session = shared.get(EgressPolicy(LOOPBACK))
        await call(second, {})
        assert shared.get(EgressPolicy(LOOPBACK)) is session
        assert len(server.peers) == 1
    finally:
        await shared.aclose()


async def test_aclose_closes_an_own_session_only(server: Server) -> None:
    """aclose closes the session the tool made itself, never a borrowed one."""
    own = http_tool("own", "d", "GET", server.url + "/x", SCHEMA, allow_hosts=LOOPBACK)
    assert not (await call(own, {})).is_error
    await own.aclose()
    after = await call(own, {})
    assert after.is_error and "closed" in after.output

    shared = SharedSession()
    try:
        borrowing = make(server.url + "/x", shared)
        await call(borrowing, {})
        await borrowing.aclose()
        assert not shared.closed and not shared.get(EgressPolicy(LOOPBACK)).closed
        assert not (await call(borrowing, {})).is_error
    finally:
        await shared.aclose()
    assert shared.closed


async def test_literal_header_values_are_secret_too(server: Server, shared: SharedSession) -> None:
    """A header written out literally is sent, but kept out of repr and of the reply text."""
    tool = make(server.url + "/x", shared, headers={"X-Api-Key": SECRET})
    result = await call(tool, {})
    assert server.last.headers["X-Api-Key"] == SECRET
    assert '"X-Api-Key": "[redacted]"' in result.output
    assert SECRET not in repr(tool) and "X-Api-Key" in repr(tool)


async def test_descriptive_header_values_are_not_scrubbed(
    server: Server, shared: SharedSession
) -> None:
    """A literal Content-Type or Accept is no secret: a reply mentioning it stays readable."""
    tool = make(server.url + "/x", shared, headers={"Accept": "application/json"})
    result = await call(tool, {})
    assert '"Accept": "application/json"' in result.output


async def test_reply_charset_is_honoured(server: Server, shared: SharedSession) -> None:
    """A latin-1 reply is decoded with the charset its Content-Type names."""
    result = await call(make(server.url + "/latin1", shared), {})
    assert result.output == "café"
