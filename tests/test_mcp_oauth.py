"""Signing in to a remote MCP server: the sign-in link is a suspension.

The servers are real and started here (examples/mcp_oauth_servers.py): an authorization server
made of the SDK's own OAuth routes, and the SDK's MCPServer protecting its tools with the
tokens it issues. The person is played by an HTTP GET of the authorization URL, which the
authorization server answers with a redirect carrying the code and the state, as a browser
would follow it; the redirect URL is handed back (``sign_in_answer``, or serve's callback).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest

from tests.conftest import assert_no_leaks
from tests.mcp_servers.fixtures import ROOT, config
from toolnexus_async import (
    Answer,
    Inbox,
    LlmClient,
    Message,
    Request,
    Toolkit,
    ToolReturn,
    UsageError,
    UserMessage,
    pending_of,
)
from toolnexus_async.durable import DurableHost, SqliteRunStore
from toolnexus_async.mcp import MemoryTokens, RunStoreTokens, parse_config, sign_in_answer
from toolnexus_async.testing import reply, tool_call

SIGNED_IN = '{"result": "you are signed in"}'  # what whoami answers, as structured content
REDIRECT = "http://127.0.0.1:9/oauth/callback"  # never visited: the test takes the redirect


@contextmanager
def oauth_servers(**env: str) -> Iterator[tuple[str, str]]:
    """The authorization server and the MCP server it protects: (issuer, MCP endpoint)."""
    process = subprocess.Popen(
        [sys.executable, "examples/mcp_oauth_servers.py"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline().split()
        assert ready[:1] == ["READY"], "the OAuth test servers did not start"
        yield ready[1], ready[2]
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    with oauth_servers() as urls:
        yield urls


def guarded(url: str, **oauth: str) -> dict[str, Any]:
    return config(guarded={"url": url, "oauth": {"redirectUri": REDIRECT, **oauth}})


def model(messages: list[Message], tools: list[Any]) -> Any:
    """Calls the tools its prompt names, one per turn, then ends with the last result."""
    [prompt] = [m.text for m in messages if isinstance(m, UserMessage)]
    done = [m for m in messages if isinstance(m, ToolReturn)]
    names = prompt.split()
    if len(done) == len(names):
        last = done[-1]
        return ("error: " if last.is_error else "") + last.output
    return reply(tool_call(names[len(done)], {}, id=f"c{len(done)}"))


async def follow(request: Request) -> str:
    """What a browser does with the sign-in link: the redirect URL it ends up at."""
    assert request.kind == "authorization" and request.url is not None
    location = request.url
    async with httpx2.AsyncClient() as http:
        while not location.startswith(REDIRECT):  # the authorization server's own pages
            response = await http.get(location)
            assert response.status_code == 302, response.text
            location = response.headers["location"]
    return location


async def stats(issuer: str) -> dict[str, int]:
    async with httpx2.AsyncClient() as http:
        return dict((await http.get(f"{issuer}/admin/stats")).json())


class Signing:
    """An Inbox as ``wait_for``, which tells the test of each request it parks."""

    def __init__(self) -> None:
        self.inbox = Inbox()
        self._send, self.asked = anyio.create_memory_object_stream[Request](10)

    async def __call__(self, request: Request) -> Answer:
        await self._send.send(request)
        return await self.inbox(request)

    def close(self) -> None:
        self._send.close()
        self.asked.close()


def test_the_oauth_keys_of_the_config():
    [plain, off, headed, fixed] = parse_config(
        {
            "plain": {"url": "https://a.example/mcp"},
            "off": {"url": "https://a.example/mcp", "oauth": False},
            "headed": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer x"}},
            "fixed": {
                "url": "https://a.example/mcp",
                "oauth": {
                    "clientId": "app",
                    "clientSecret": "${APP_SECRET}",
                    "scope": "read admin",
                    "redirectUri": "https://me.example/oauth/callback",
                },
            },
        }
    )
    assert plain.oauth is not None and plain.oauth.client_id is None
    assert off.oauth is None and headed.oauth is None
    assert fixed.oauth is not None
    assert (fixed.oauth.client_id, fixed.oauth.scope) == ("app", "read admin")
    assert "APP_SECRET" not in repr(fixed) and "'[set]'" in repr(fixed.oauth)
    for bad, says in (
        ({"oauth": {"clientID": "x"}}, "unknown oauth field(s) clientID"),
        ({"oauth": "yes"}, "oauth must be false or an object"),
        ({"oauth": {"clientSecret": "s"}}, "oauth.clientSecret needs oauth.clientId"),
        ({"oauth": {"redirectUri": "ftp://x"}}, "oauth.redirectUri must be an http"),
        ({"oauth": {"scope": 3}}, "oauth.scope must be a non-empty string"),
    ):
        with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
            parse_config({"s": {"url": "https://a.example/mcp", **bad}})
    with pytest.raises(UsageError, match="a local server takes command, not url, headers or oauth"):
        parse_config({"s": {"command": ["x"], "oauth": {}}})


async def test_a_run_signs_in_through_the_inbox_and_the_tool_result_arrives(servers, caplog):
    issuer, url = servers
    caplog.set_level(logging.DEBUG)
    signing, tokens = Signing(), MemoryTokens()
    async with (
        Toolkit.create(builtins=False, mcp=guarded(url), mcp_tokens=tokens) as toolkit,
        LlmClient.in_process(model, wait_for=signing) as client,
    ):
        status = toolkit.mcp_status["guarded"]
        assert (status.state, status.tools) == ("needs_auth", ("guarded_sign_in",))
        assert "guarded_sign_in" in (status.error or "")
        async with anyio.create_task_group() as tg:
            finished: list[Any] = []

            async def run() -> None:
                finished.append(await client.run("guarded_sign_in guarded_whoami", toolkit))

            tg.start_soon(run)
            request = await signing.asked.receive()
            assert request.prompt == "Sign in to the MCP server 'guarded' to go on"
            query = parse_qs(urlsplit(request.url or "").query)
            assert query["code_challenge_method"] == ["S256"] and query["scope"] == ["read"]
            assert query["redirect_uri"] == [REDIRECT]
            redirect = await follow(request)
            answer = await sign_in_answer(toolkit, redirect)
            assert answer == Answer(request.id, True, {"state": query["state"][0]})
            await signing.inbox.answer(answer)
        [done] = finished
        assert (done.status, done.text) == ("done", SIGNED_IN)
        status = toolkit.mcp_status["guarded"]
        assert status.state == "connected" and "guarded_whoami" in status.tools
        assert "guarded_sign_in" not in toolkit
        # A state works once.
        with pytest.raises(UsageError, match="no sign-in under way has this state"):
            await sign_in_answer(toolkit, redirect)
        with pytest.raises(UsageError, match="no sign-in under way has this state"):
            await sign_in_answer(toolkit, redirect.replace("state=", "state=x"))
        kept = await tokens.get(f"mcp-oauth guarded {url}")
        assert kept is not None
        secrets = [kept["tokens"]["access_token"], kept["tokens"]["refresh_token"]]
        shown = caplog.text + repr(toolkit) + repr(toolkit.mcp_status) + repr(tokens)
        assert not [secret for secret in secrets if secret in shown]
        assert (await stats(issuer))["registered"] >= 1
    signing.close()
    assert_no_leaks()


async def test_a_call_asking_for_more_scope_suspends_and_goes_on_after_the_sign_in(servers):
    """Step-up: the token lacks ``admin``; the 403 challenge becomes a new sign-in for the
    call, asking for both scopes, and the call is made again once it is done."""
    _, url = servers
    async with (
        Toolkit.create(builtins=False, mcp=guarded(url)) as toolkit,
        LlmClient.in_process(model) as client,  # no wait_for: each sign-in halts the run
    ):
        first = await client.run("guarded_sign_in", toolkit)
        assert first.status == "pending" and first.pending is not None
        answer = await sign_in_answer(toolkit, await follow(first.pending))
        result = await toolkit.execute("guarded_sign_in", {}, ctx_for(first.pending, answer))
        assert not result.is_error, result.output
        halted = await client.run("guarded_admin_report", toolkit)
        assert halted.status == "pending" and halted.pending is not None
        query = parse_qs(urlsplit(halted.pending.url or "").query)
        assert query["scope"] == ["read admin"]
        answer = await sign_in_answer(toolkit, await follow(halted.pending))
        retry = await toolkit.execute("guarded_admin_report", {}, ctx_for(halted.pending, answer))
        assert (retry.is_error, retry.output) == (False, '{"result": "the admin report"}')
        assert (await toolkit.execute("guarded_whoami", {})).output == SIGNED_IN
    assert_no_leaks()


def ctx_for(request: Request, answer: Answer) -> Any:
    from toolnexus_async import ToolContext

    return ToolContext(answer=answer, request=request)


async def test_a_reconnect_refused_for_want_of_a_sign_in_asks_through_the_next_call(servers):
    """The session ended and the sign-in is gone (forgotten by the token store): connecting
    again is refused, the server is ``needs_auth`` and keeps its tools, and the call that
    asked for the new session suspends with a link; once answered, it connects and runs."""
    _, url = servers
    tokens = MemoryTokens()
    async with Toolkit.create(builtins=False, mcp=guarded(url), mcp_tokens=tokens) as toolkit:
        first = await toolkit.execute("guarded_sign_in", {})
        request = pending_of(first)
        assert request is not None
        answer = await sign_in_answer(toolkit, await follow(request))
        assert not (await toolkit.execute("guarded_sign_in", {}, ctx_for(request, answer))).is_error
        await tokens.set(f"mcp-oauth guarded {url}", None)
        assert toolkit._mcp is not None
        [connection] = toolkit._mcp.connections
        assert connection.session is not None
        connection.end(connection.session, "ended by the test")
        halted = await toolkit.execute("guarded_whoami", {})
        again = pending_of(halted)
        assert again is not None and again.kind == "authorization", halted.output
        status = toolkit.mcp_status["guarded"]
        assert status.state == "needs_auth" and "guarded_whoami" in status.tools
        assert "the next call of its tools asks the person" in (status.error or "")
        answer = await sign_in_answer(toolkit, await follow(again))
        retry = await toolkit.execute("guarded_whoami", {}, ctx_for(again, answer))
        assert (retry.is_error, retry.output) == (False, SIGNED_IN)
        status = toolkit.mcp_status["guarded"]
        assert (status.state, status.reconnects) == ("connected", 1)
    assert_no_leaks()


async def test_an_expired_token_is_refreshed_and_kept_in_the_run_store(servers, tmp_path: Path):
    issuer, url = servers
    db = tmp_path / "runs.db"
    async with SqliteRunStore(db) as store:
        tokens = RunStoreTokens(store)
        async with Toolkit.create(builtins=False, mcp=guarded(url), mcp_tokens=tokens) as tk:
            first = await tk.execute("guarded_sign_in", {})
            assert first.metadata is not None
            request = first.metadata["pending"]
            answer = await sign_in_answer(tk, await follow(request))
            assert not (await tk.execute("guarded_sign_in", {}, ctx_for(request, answer))).is_error
        key = f"mcp-oauth guarded {url}"
        kept = await tokens.get(key)
        assert kept is not None and kept["expires_at"] is not None
        before = await stats(issuer)
        # The token's time is up (as far as the client knows), and the server refuses it.
        await tokens.set(key, {**kept, "expires_at": 1.0})
        async with httpx2.AsyncClient() as http:
            await http.post(f"{issuer}/admin/expire")
        async with Toolkit.create(builtins=False, mcp=guarded(url), mcp_tokens=tokens) as tk:
            assert tk.mcp_status["guarded"].state == "connected"
            assert (await tk.execute("guarded_whoami", {})).output == SIGNED_IN
        after = await stats(issuer)
        assert after["refreshed"] == before["refreshed"] + 1
        assert after["exchanged"] == before["exchanged"]  # no new sign-in
        renewed = await tokens.get(key)
        assert renewed is not None
        assert renewed["tokens"]["access_token"] != kept["tokens"]["access_token"]
    assert_no_leaks()


async def test_a_run_waiting_for_a_sign_in_survives_a_restart(servers, tmp_path: Path):
    """A durable host on a SQLite file halts the run on its sign-in; everything is closed;
    a new host on the same file takes the redirect's answer and the run finishes."""
    _, url = servers
    db = tmp_path / "runs.db"
    async with (
        SqliteRunStore(db) as store,
        Toolkit.create(
            builtins=False, mcp=guarded(url), mcp_tokens=RunStoreTokens(store)
        ) as toolkit,
        LlmClient.in_process(model) as client,
        DurableHost(client, toolkit, store) as host,
    ):
        halted = await host.run("guarded_sign_in guarded_whoami")
    assert halted.status == "pending" and halted.pending is not None
    send, results = anyio.create_memory_object_stream[Any](1)
    async with (
        send,
        results,
        SqliteRunStore(db) as store,
        Toolkit.create(
            builtins=False, mcp=guarded(url), mcp_tokens=RunStoreTokens(store)
        ) as toolkit,
        LlmClient.in_process(model) as client,
        DurableHost(client, toolkit, store, on_result=send.send) as host,
    ):
        answer = await sign_in_answer(toolkit, await follow(halted.pending))
        assert answer.id == halted.pending.id
        await host.answer(answer)
        with anyio.fail_after(30):
            done = await results.receive()
    assert (done.run_id, done.status, done.text) == (halted.run_id, "done", SIGNED_IN)
    assert_no_leaks()


async def test_a_pre_registered_client_signs_in_with_its_secret(monkeypatch):
    with oauth_servers(FIXED_CLIENT=f"app:s3cret-of-app:{REDIRECT}") as (issuer, url):
        monkeypatch.setenv("APP_SECRET", "s3cret-of-app")
        servers = guarded(url, clientId="app", clientSecret="${APP_SECRET}")
        async with Toolkit.create(builtins=False, mcp=servers) as toolkit:
            first = await toolkit.execute("guarded_sign_in", {})
            assert first.metadata is not None
            request = first.metadata["pending"]
            assert parse_qs(urlsplit(request.url).query)["client_id"] == ["app"]
            answer = await sign_in_answer(toolkit, await follow(request))
            done = await toolkit.execute("guarded_sign_in", {}, ctx_for(request, answer))
            assert (
                done.output == "signed in to MCP server 'guarded'; its tools: whoami, admin_report"
            )
            assert "s3cret-of-app" not in repr(toolkit.mcp_status)
        counted = await stats(issuer)
        assert (counted["registered"], counted["exchanged"]) == (0, 1)
    assert_no_leaks()


async def test_without_a_redirect_uri_a_401_says_what_to_set(servers):
    _, url = servers
    async with Toolkit.create(builtins=False, mcp=config(guarded={"url": url})) as toolkit:
        status = toolkit.mcp_status["guarded"]
    assert status.state == "failed"
    assert "no redirect URI is set" in (status.error or "")
    assert_no_leaks()
