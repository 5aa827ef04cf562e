"""Errors mapped at the transport edge keep no link to the originals, which may hold secrets.

The edge is exercised as in production, through the aiohttp transport and a loopback
server; the one test about continuing a failed run, not about the edge, plays the provider
over the mock transport.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import FakeProvider, assert_no_leaks, openai_reply
from tests.shared import loopback, run_or_stream
from toolnexus_async import (
    AiohttpTransport,
    HttpRequest,
    LlmClient,
    ProtocolError,
    ProviderError,
    RetryPolicy,
    Toolkit,
    ToolReturn,
    TransportError,
    UsageError,
    define_tool,
)

KEY = "sk-very-secret-key"
NO_RETRY = RetryPolicy(retries=0)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def assert_unlinked(error: BaseException) -> None:
    """No cause and no context: nothing but our own message travels with the error."""
    assert error.__cause__ is None
    assert error.__context__ is None
    assert KEY not in repr(error.args)


async def test_a_refused_connection_keeps_no_aiohttp_error():
    """TransportError neither chains nor carries the aiohttp exception as context."""
    url = f"http://127.0.0.1:{closed_port()}/v1"
    async with LlmClient(
        url, model="m", api_key=KEY, headers={"X-Token": KEY}, retry=NO_RETRY
    ) as client:
        with pytest.raises(TransportError) as caught:
            await client.run("hi", Toolkit.create(builtins=False))
    assert_unlinked(caught.value)
    assert_no_leaks()


async def test_a_body_that_is_not_json_keeps_no_decode_error(fake_llm: Any):
    """The JSON decode error (which holds the whole raw body) is not kept as context."""
    fake_llm.handler = lambda body, seen: (200, f"<html>{KEY}</html>")
    async with LlmClient(fake_llm.url, model="m", api_key=KEY) as client:
        with pytest.raises(ProtocolError, match="not JSON") as caught:
            await client.run("hi", Toolkit.create(builtins=False))
    assert_unlinked(caught.value)
    assert KEY not in str(caught.value)


async def test_a_2xx_error_body_echoing_the_key_keeps_no_unscrubbed_error(fake_llm: Any):
    """The codec's unscrubbed ProtocolError does not survive as __context__."""
    fake_llm.handler = lambda body, seen: {"error": {"message": f"bad key {KEY}"}}
    async with LlmClient(fake_llm.url, model="m", api_key=KEY) as client:
        with pytest.raises(ProtocolError, match="redacted") as caught:
            await client.run("hi", Toolkit.create(builtins=False))
    assert_unlinked(caught.value)
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("style", "options", "named"),
    [
        ("openai", {"api_key": KEY + "\n"}, "'Authorization'"),
        ("anthropic", {"api_key": KEY + "\n"}, "'x-api-key'"),
        ("openai", {"api_key": KEY, "headers": {"X-Org": "org\r\nX-Evil: 1"}}, "'X-Org'"),
    ],
    ids=["bearer", "x-api-key", "headers="],
)
async def test_a_header_that_cannot_be_sent_is_a_usage_error_naming_it_not_its_value(
    fake_llm: Any, style: str, options: dict[str, Any], named: str
):
    """A key read from a file with its newline: UsageError when the client is made (the
    caller's configuration), the header's name in the message, its value nowhere, nothing
    sent."""
    with pytest.raises(UsageError) as caught:
        LlmClient(fake_llm.url, style, "m", retry=NO_RETRY, **options)
    message = str(caught.value)
    assert f"header {named} holds a control character" in message
    assert KEY not in message and "org" not in message
    assert_unlinked(caught.value)
    assert fake_llm.requests == []
    assert_no_leaks()


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
async def test_a_value_error_from_aiohttp_is_a_transport_error(stream: bool):
    """A request the client would have refused, sent to the transport directly: aiohttp's
    ValueError leaves it as a TransportError, with neither the header's value nor the
    original attached."""
    transport = AiohttpTransport()
    app = web.Application()
    async with loopback(app) as url:
        request = HttpRequest("POST", url + "/x", {"X-Key": KEY + "\n"}, b"{}", 5.0, 1000)
        with pytest.raises(TransportError) as caught:
            if stream:
                async for _ in transport.stream(request):
                    pass
            else:
                await transport.send(request)
    await transport.aclose()
    assert "ValueError" in str(caught.value) and KEY not in str(caught.value)
    assert_unlinked(caught.value)
    assert_no_leaks()


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
async def test_a_redirect_is_not_followed_and_says_where_it_pointed(stream: bool):
    """aiohttp would send x-api-key and the caller's headers on to another origin: a 3xx is
    a ProviderError naming the Location, and nothing reaches where it points."""
    elsewhere: list[dict[str, str]] = []

    async def provider(request: web.Request) -> web.Response:
        await request.read()
        port = request.url.port
        raise web.HTTPTemporaryRedirect(f"http://localhost:{port}/elsewhere/v1/messages")

    async def other(request: web.Request) -> web.Response:
        elsewhere.append(dict(request.headers))
        return web.json_response({"error": "must not be reached"}, status=500)

    app = web.Application()
    app.router.add_post("/v1/messages", provider)
    app.router.add_post("/elsewhere/v1/messages", other)
    async with (
        loopback(app) as url,
        LlmClient(
            url, "anthropic", "m", api_key=KEY, headers={"X-Org": KEY + "-org"}, retry=NO_RETRY
        ) as client,
    ):
        with pytest.raises(ProviderError) as caught:
            await run_or_stream(client, stream)
    port = url.rpartition(":")[2]
    assert elsewhere == []
    assert caught.value.status == 307
    assert caught.value.hint is not None
    assert f"redirected the request to http://localhost:{port}/elsewhere/v1/messages" in str(
        caught.value
    )
    assert KEY not in str(caught.value)
    assert_unlinked(caught.value)


async def test_a_model_error_mid_run_carries_the_run_to_continue_from(provider: FakeProvider):
    """A provider failure after tools ran: error.run keeps their results; continuing from it
    with run(None, history=...) does not run them again."""
    calls: list[int] = []

    @define_tool
    async def charge(amount: int) -> str:
        """Charge an amount."""
        calls.append(amount)
        return f"charged {amount}"

    state = {"fail": True}

    def handler(body: dict[str, Any], seen: Any) -> Any:
        if not any(m["role"] == "tool" for m in body["messages"]):
            return openai_reply(None, [("c1", "charge", {"amount": 7})])
        if state["fail"]:
            return (503, "overloaded")
        return openai_reply("all done")

    provider.handler = handler
    toolkit = Toolkit.create(builtins=False, extra_tools=[charge])
    async with provider.client(api_key=KEY, retry=NO_RETRY) as client:
        with pytest.raises(ProviderError) as caught:
            await client.run("charge 7", toolkit)
        run = caught.value.run
        assert run is not None
        assert (run.status, run.limit, run.turns) == ("incomplete", "model_error", 1)
        assert run.messages[-1] == ToolReturn("c1", "charge", "charged 7")
        state["fail"] = False
        result = await client.run(None, toolkit, history=run.messages)

    assert result.text == "all done"
    assert calls == [7]
    sent = provider.bodies[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]


async def test_run_none_without_history_is_refused():
    """Continuing needs something to continue."""
    async with LlmClient.in_process(lambda m, t: "x") as client:
        with pytest.raises(UsageError, match="history"):
            await client.run(None, Toolkit.create(builtins=False))
