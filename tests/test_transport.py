"""The transport seam: a client over any Transport, and the mock one in testing.

With :class:`MockTransport` a real :class:`LlmClient` (codec, error mapping, retries,
streaming) runs against a provider played by a function, with no socket. What a reply
means is decided above the transport, so the same reply gives the same error whatever
sends it; the aiohttp transport's own behaviour is tested over loopback elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from tests.conftest import assert_no_leaks
from toolnexus_async import (
    AiohttpTransport,
    HttpRequest,
    HttpResponse,
    Limits,
    LlmClient,
    ProtocolError,
    ProviderError,
    ReplyTooLargeError,
    RetryPolicy,
    Toolkit,
    Transport,
    TransportError,
    UsageError,
    define_tool,
)
from toolnexus_async.testing import MockTransport, json_response, sse_response

KEY = "sk-transport-test-key-0123456789"
BASE = "https://llm.example.com/v1"
FAST = RetryPolicy(base_delay=0)


def openai(content: str | None = None, *calls: tuple[str, str, dict[str, Any]]) -> HttpResponse:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in calls
        ]
    return json_response({"choices": [{"message": message}], "model": "m-1"})


@define_tool
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


async def run(transport: Transport, *, style: str = "openai", **options: Any) -> Any:
    async with (
        Toolkit.create(builtins=False, extra_tools=[add]) as toolkit,
        LlmClient(BASE, style, "m", api_key=KEY, transport=transport, **options) as client,
    ):
        return await client.run("2 + 3?", toolkit)


async def test_a_whole_run_over_the_mock_transport():
    """Two model turns with a tool call between them, no socket: what was sent is checked."""
    replies = [openai(None, ("c1", "add", {"a": 2, "b": 3})), openai("5")]
    transport = MockTransport(lambda request: replies[len(transport.requests) - 1])
    result = await run(transport)
    assert (result.status, result.text, result.turns) == ("done", "5", 2)
    first, _ = transport.requests
    assert first.method == "POST" and first.url == f"{BASE}/chat/completions"
    assert first.headers["Authorization"] == f"Bearer {KEY}"
    assert first.timeout == 600.0 and first.max_bytes == Limits().max_reply_bytes
    assert [t["function"]["name"] for t in transport.body(0)["tools"]] == ["add"]
    assert transport.body(1)["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "5",
    }
    assert transport.closed
    assert_no_leaks()


async def test_the_anthropic_style_over_the_mock_transport():
    def handler(request: HttpRequest) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}

    transport = MockTransport(handler)
    result = await run(transport, style="anthropic")
    assert result.text == "hi"
    assert transport.requests[0].url == f"{BASE}/messages"
    assert transport.requests[0].headers["x-api-key"] == KEY


async def test_a_streamed_run_over_the_mock_transport_in_small_pieces():
    """Events cut every 3 bytes still decode: the decoders meet a real network's framing."""
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
        "[DONE]",
    ]
    transport = MockTransport(lambda request: sse_response(chunks), chunk_size=3)
    async with (
        Toolkit.create(builtins=False) as toolkit,
        LlmClient(BASE, model="m", api_key=KEY, transport=transport) as client,
        client.stream("hi", toolkit) as events,
    ):
        texts = [event.text async for event in events if event.kind == "text"]
    assert "".join(texts) == "Hello"
    assert transport.body()["stream"] is True


async def test_a_provider_error_is_mapped_and_retried_whatever_the_transport():
    statuses = [503, 503]

    def handler(request: HttpRequest) -> HttpResponse:
        if statuses:
            return json_response({"error": {"message": f"busy, key {KEY}"}}, statuses.pop())
        return openai("finally")

    transport = MockTransport(handler)
    assert (await run(transport, retry=FAST)).text == "finally"
    assert len(transport.requests) == 3

    always = MockTransport(lambda r: json_response({"error": {"message": KEY}}, status=400))
    with pytest.raises(ProviderError) as caught:
        await run(always, retry=FAST)
    assert caught.value.status == 400 and KEY not in str(caught.value)
    assert len(always.requests) == 1  # a 400 is not retried


async def test_a_redirect_is_a_provider_error_whose_hint_says_where_it_pointed():
    """A relative Location is resolved against the endpoint and shown without the
    credentials of base_url; a 3xx is not retried."""
    moved = MockTransport(lambda r: json_response({}, 308, {"location": "/v2/chat?x=1"}))
    async with (
        Toolkit.create(builtins=False) as toolkit,
        LlmClient(
            "https://bob:hunter2@llm.example.com/v1", model="m", api_key=KEY, transport=moved
        ) as client,
    ):
        with pytest.raises(ProviderError) as caught:
            await client.run("hi", toolkit)
    assert caught.value.status == 308 and len(moved.requests) == 1
    assert caught.value.hint is not None
    assert caught.value.hint.startswith(
        "the provider redirected the request to https://[redacted]@llm.example.com/v2/chat?x=1;"
    )
    assert "hunter2" not in str(caught.value)


async def test_a_body_that_is_not_json_and_one_too_large_are_protocol_errors():
    not_json = MockTransport(lambda r: HttpResponse(200, {}, b"<html>oops</html>"))
    with pytest.raises(ProtocolError, match="not JSON"):
        await run(not_json)
    big = MockTransport(lambda r: openai("x" * 10_000))
    with pytest.raises(ReplyTooLargeError):
        await run(big, limits=Limits(max_reply_bytes=1_000))


async def test_a_transport_error_from_the_handler_is_retried_and_scrubbed():
    failures = [TransportError(f"POST {BASE} failed: reset (key {KEY})")]

    def handler(request: HttpRequest) -> HttpResponse:
        if failures:
            raise failures.pop()
        return openai("ok")

    assert (await run(MockTransport(handler), retry=FAST)).text == "ok"

    def down(request: HttpRequest) -> HttpResponse:
        raise TransportError(f"POST {BASE} failed: refused (key {KEY})")

    with pytest.raises(TransportError) as caught:
        await run(MockTransport(down), retry=RetryPolicy(retries=0))
    assert KEY not in str(caught.value) and "[redacted]" in str(caught.value)
    assert caught.value.__context__ is None


async def test_the_request_timeout_travels_with_the_request():
    """The transport applies it: a handler that hangs is a TransportError, retried."""
    calls: list[float | None] = []

    async def slow_once(request: HttpRequest) -> HttpResponse:
        calls.append(request.timeout)
        if len(calls) == 1:
            await anyio.sleep_forever()
        return openai("second time")

    with anyio.fail_after(5):
        result = await run(
            MockTransport(slow_once), limits=Limits(request_timeout=0.05), retry=FAST
        )
    assert result.text == "second time" and calls == [0.05, 0.05]


def test_what_is_not_a_transport_is_refused_where_it_is_passed():
    with pytest.raises(UsageError, match="transport must have send"):
        LlmClient(BASE, model="m", transport=object())  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="handler must be callable"):
        MockTransport("not a function")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="max_connections"):
        AiohttpTransport(max_connections=0)
    assert isinstance(MockTransport(lambda r: openai("x")), Transport)
    assert isinstance(AiohttpTransport(), Transport)


async def test_a_handler_returning_something_else_is_a_usage_error():
    with pytest.raises(UsageError, match="return an HttpResponse"):
        await run(MockTransport(lambda r: "hello"))  # type: ignore[arg-type,return-value]


def test_a_request_hides_its_headers_and_body_from_its_repr():
    request = HttpRequest("POST", BASE, {"Authorization": f"Bearer {KEY}"}, b"{}", 1.0, 10)
    assert KEY not in repr(request) and "content" not in repr(request)
