"""Bad replies from a model endpoint: too large, nested too deeply, echoing secrets.

Each reply is served by a real aiohttp server on 127.0.0.1 and must end in a typed error of
ours (never a bare RecursionError, never a reply read whole into memory), with no secret in
what the error shows. Tool arguments nested too deeply are not about the reply's reading:
that test plays the provider over the mock transport.
"""

from __future__ import annotations

import gzip
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import FakeProvider, assert_no_leaks, openai_reply
from tests.shared import every_path
from toolnexus_async import (
    Limits,
    LlmClient,
    ProtocolError,
    ProviderError,
    ReplyTooLargeError,
    RetryPolicy,
    Toolkit,
    TransportError,
    UsageError,
)

KEY = "sk-test-very-secret-key-0123456789"
NO_RETRY = RetryPolicy(retries=0)
LIMIT = 64 * 1024
DEEP = 100_000


def big_reply() -> bytes:
    """A valid Chat Completions reply whose text is four times the limit."""
    text = "x" * (4 * LIMIT)
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


class Served:
    """What the handler saw: how many requests, and how much of each reply was written."""

    def __init__(self) -> None:
        self.requests = 0


async def serve(body: bytes, *, chunked: bool = False, gzipped: bool = False) -> Any:
    """A handler that writes ``body`` as the reply, in one of three framings."""
    served = Served()

    async def handle(request: web.Request) -> web.StreamResponse:
        served.requests += 1
        await request.read()
        if gzipped:
            return web.Response(
                body=gzip.compress(body),
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            )
        if not chunked:
            return web.Response(body=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), 4096):
            await response.write(body[start : start + 4096])
        await response.write_eof()
        return response

    return handle, served


async def run_against(url: str, **options: Any) -> None:
    async with (
        Toolkit.create(builtins=False) as toolkit,
        LlmClient(url, model="m", api_key=KEY, retry=NO_RETRY, **options) as client,
    ):
        await client.run("hi", toolkit)


@pytest.mark.parametrize("framing", ["content-length", "chunked", "gzip"])
async def test_a_reply_over_max_reply_bytes_is_refused_typed(framing: str):
    """Past the cap the reply is abandoned with ReplyTooLargeError, however it is framed.

    gzip matters: the Content-Length of a compressed body says nothing about its size once
    decompressed, so the cap counts decompressed bytes.
    """
    handle, served = await serve(
        big_reply(), chunked=framing == "chunked", gzipped=framing == "gzip"
    )
    async with every_path(handle, lambda: None) as url:
        with pytest.raises(ReplyTooLargeError) as caught:
            await run_against(url, limits=Limits(max_reply_bytes=LIMIT))
    assert caught.value.limit == LIMIT
    assert f"max_reply_bytes={LIMIT}" in str(caught.value)
    assert isinstance(caught.value, ProtocolError)
    assert served.requests == 1  # too large is not a reason to try again
    assert_no_leaks()


async def test_a_reply_within_max_reply_bytes_is_read():
    """The same reply under a cap it fits in is an ordinary answer."""
    handle, _ = await serve(big_reply(), chunked=True)
    async with every_path(handle, lambda: None) as url:
        async with (
            Toolkit.create(builtins=False) as toolkit,
            LlmClient(
                url, model="m", api_key=KEY, limits=Limits(max_reply_bytes=8 * LIMIT)
            ) as client,
        ):
            result = await client.run("hi", toolkit)
    assert result.text == "x" * (4 * LIMIT)


async def test_a_streamed_reply_over_max_reply_bytes_is_refused_typed():
    """A stream counts every chunk: a model that never stops talking hits the cap."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "y" * 1000}}]}
        line = f"data: {json.dumps(chunk)}\n\n".encode()
        for _ in range(4 * LIMIT // len(line) + 1):
            await response.write(line)
        await response.write(b"data: [DONE]\n\n")
        return response

    async with every_path(handle, lambda: None) as url:
        async with (
            Toolkit.create(builtins=False) as toolkit,
            LlmClient(
                url, model="m", api_key=KEY, retry=NO_RETRY, limits=Limits(max_reply_bytes=LIMIT)
            ) as c,
        ):
            with pytest.raises(ReplyTooLargeError):
                async with c.stream("hi", toolkit) as events:
                    async for _ in events:
                        pass
    assert_no_leaks()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_reply_bytes_must_be_a_positive_int(bad: object):
    with pytest.raises(UsageError, match="max_reply_bytes"):
        LlmClient("http://127.0.0.1:1/v1", model="m", limits=Limits(max_reply_bytes=bad))  # type: ignore[arg-type]


async def test_a_reply_nested_too_deeply_is_a_protocol_error():
    """100,000 nested arrays: json.loads hits the recursion limit; we say what happened."""
    handle, _ = await serve(b"[" * DEEP + b"]" * DEEP)
    async with every_path(handle, lambda: None) as url:
        with pytest.raises(ProtocolError, match="nested too deeply") as caught:
            await run_against(url)
    assert caught.value.__context__ is None
    assert_no_leaks()


async def test_a_streamed_event_nested_too_deeply_is_a_protocol_error():
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + b"[" * DEEP + b"]" * DEEP + b"\n\n")
        return response

    async with every_path(handle, lambda: None) as url:
        async with (
            Toolkit.create(builtins=False) as toolkit,
            LlmClient(url, model="m", api_key=KEY, retry=NO_RETRY) as client,
        ):
            with pytest.raises(ProtocolError, match="nested too deeply"):
                async with client.stream("hi", toolkit) as events:
                    async for _ in events:
                        pass


async def test_tool_arguments_nested_too_deeply_are_invalid_arguments(provider: FakeProvider):
    """A call whose argument text is too deep to parse is fed back as invalid arguments."""
    deep = "[" * DEEP + "]" * DEEP
    provider.script(openai_reply(None, [("c1", "anything", deep)]), openai_reply("ok"))
    async with (
        Toolkit.create(builtins=False) as toolkit,
        provider.client(api_key=KEY) as client,
    ):
        result = await client.run("hi", toolkit)
    assert result.text == "ok"
    assert len(provider.requests) == 2
    fed = provider.bodies[1]["messages"][-1]
    assert fed["role"] == "tool" and "expected a JSON object" in fed["content"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_credentials_in_base_url_never_show():
    """A password in base_url stays out of error texts and reprs (it would reach the page)."""
    url = f"http://bob:hunter2-secret@127.0.0.1:{closed_port()}/v1"
    client = LlmClient(url, model="m", retry=NO_RETRY)
    assert "hunter2" not in repr(client)
    async with client, Toolkit.create(builtins=False) as toolkit:
        with pytest.raises(TransportError) as caught:
            await client.run("hi", toolkit)
    assert "hunter2" not in str(caught.value)
    assert "[redacted]@127.0.0.1" in str(caught.value)


@pytest.mark.parametrize(
    "auth", [{"api_key": "sk-0123456789abcdef"}, {"headers": {"authorization": "Bearer t0k3n"}}]
)
async def test_credentials_in_base_url_beside_an_authorization_header_are_refused_at_once(
    auth: dict[str, Any],
) -> None:
    """aiohttp refuses both on every request: such a client could never work, so it is
    refused when it is made, without the secret; anthropic's key is another header."""
    url = "http://bob:hunter2-secret@127.0.0.1:9/v1"
    with pytest.raises(UsageError, match="both would be the Authorization header") as caught:
        LlmClient(url, model="m", **auth)
    assert "hunter2" not in str(caught.value)
    async with LlmClient(url, style="anthropic", model="m", api_key="sk-0123456789abcdef"):
        pass


async def test_credentials_in_base_url_are_scrubbed_from_provider_errors():
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "bad auth hunter2-secret"}}, status=401)

    async with every_path(handle, lambda: None) as url:
        authed = url.replace("http://", "http://bob:hunter2-secret@")
        async with (
            Toolkit.create(builtins=False) as toolkit,
            LlmClient(authed, model="m", retry=NO_RETRY) as client,
        ):
            with pytest.raises(ProviderError) as caught:
                await client.run("hi", toolkit)
    error = caught.value
    assert "hunter2" not in str(error) and "hunter2" not in error.url
    assert "hunter2" not in error.body


async def test_reply_headers_that_echo_the_key_are_scrubbed():
    """A proxy that echoes the request's Authorization in its reply headers gets redacted."""

    async def handle(request: web.Request) -> web.StreamResponse:
        echoed = request.headers.get("Authorization", "")
        return web.json_response(
            {"error": {"message": "nope"}}, status=400, headers={"X-Echo": echoed}
        )

    async with every_path(handle, lambda: None) as url:
        with pytest.raises(ProviderError) as caught:
            await run_against(url)
    assert KEY not in json.dumps(caught.value.headers)
    assert caught.value.headers["x-echo"] == "Bearer [redacted]"
