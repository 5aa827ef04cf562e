"""The request body on the wire: what the codec built, the tools' JSON encoded once per toolkit."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from toolnexus_async import LlmClient, ModelSettings, Toolkit, define_tool
from toolnexus_async._core.codecs import render_openai
from toolnexus_async._core.codecs._tools import _REMEMBER, shared_json
from toolnexus_async._core.http import HttpRequest
from toolnexus_async.testing import MockTransport, json_response

REPLIES = {
    "openai": {
        "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]
    },
    "anthropic": {
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    },
}


@define_tool
async def weather(city: str) -> str:
    """The weather in a city, with “quotes” and ünïcode.

    Args:
        city: the city's name.
    """
    return f"{city}: sunny"


@define_tool
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def _client(style: str, transport: MockTransport, **kwargs: Any) -> LlmClient:
    return LlmClient(
        "https://llm.test/v1",
        style=style,
        model="m",
        api_key="sk-test-0123456789",
        **kwargs,
        transport=transport,
    )


def _expected(client: LlmClient, prompt: str, toolkit: Toolkit) -> Any:
    """What the codec builds for a first request, through the json module."""
    model = client.engine.model
    codec = model._codec  # type: ignore[attr-defined]
    from toolnexus_async._core.messages import UserMessage

    body = codec.encode(
        [UserMessage(prompt)],
        toolkit.specs,
        model="m",
        max_tokens=model._max_tokens,  # type: ignore[attr-defined]
        max_tokens_field=model._max_tokens_field,  # type: ignore[attr-defined]
        extra=model._extra,  # type: ignore[attr-defined]
    )
    return json.loads(json.dumps(body))


@pytest.mark.parametrize("style", ["openai", "anthropic"])
async def test_each_body_is_the_codecs_body(style: str) -> None:
    """Toolkit after toolkit (and back), every body decodes to what the codec built: the
    kept tools' text is never sent for another toolkit."""
    transport = MockTransport(lambda request: json_response(REPLIES[style]))
    one = Toolkit.create(builtins=False, extra_tools=[weather])
    two = Toolkit.create(builtins=False, extra_tools=[weather, add])
    async with _client(style, transport) as client:
        for prompt, toolkit in [("a", one), ("b", one), ("c", two), ("d", one), ("é", two)]:
            await client.run(prompt, toolkit)
            assert transport.body() == _expected(client, prompt, toolkit)
    names = [
        [t.get("name") or t["function"]["name"] for t in b["tools"]]
        for b in (transport.body(i) for i in range(5))
    ]
    assert names == [["weather"], ["weather"], ["weather", "add"], ["weather"], ["weather", "add"]]


async def test_a_tool_registered_between_requests_is_sent() -> None:
    transport = MockTransport(lambda request: json_response(REPLIES["openai"]))
    toolkit = Toolkit.create(builtins=False, extra_tools=[weather])
    async with _client("openai", transport) as client:
        await client.run("a", toolkit)
        toolkit.register(add)
        await client.run("b", toolkit)
    assert [t["function"]["name"] for t in transport.body()["tools"]] == ["weather", "add"]


async def test_tools_given_in_extra_body_are_encoded_as_they_are_at_each_request() -> None:
    """A list of the caller's own (extra_body's "tools") is not a shared rendering: a change
    to it between requests is sent."""
    mine: list[dict[str, Any]] = [{"type": "function", "function": {"name": "first"}}]
    transport = MockTransport(lambda request: json_response(REPLIES["openai"]))
    toolkit = Toolkit.create(builtins=False, extra_tools=[weather])
    async with _client(
        "openai", transport, settings=ModelSettings(extra_body={"tools": mine})
    ) as client:
        await client.run("a", toolkit)
        mine[0]["function"]["name"] = "second"
        await client.run("b", toolkit)
    assert [transport.body(i)["tools"] for i in range(2)] == [
        [{"type": "function", "function": {"name": "first"}}],
        [{"type": "function", "function": {"name": "second"}}],
    ]


async def test_a_body_without_tools() -> None:
    transport = MockTransport(lambda request: json_response(REPLIES["openai"]))
    async with _client("openai", transport) as client:
        await client.run("a", Toolkit.create(builtins=False))
    request: HttpRequest = transport.requests[-1]
    assert "tools" not in json.loads(request.content)


def test_a_rendering_stops_being_shared_when_the_cache_drops_it() -> None:
    toolkits = [Toolkit.create(builtins=False, extra_tools=[weather]) for _ in range(_REMEMBER)]
    first = render_openai(toolkits[0].specs)
    text = shared_json(first)
    assert text is not None and json.loads(text) == first
    assert shared_json(first) is text  # encoded once
    for toolkit in toolkits[1:]:
        render_openai(toolkit.specs)
    assert shared_json(first) is text  # _REMEMBER renderings are remembered
    render_openai(Toolkit.create(builtins=False, extra_tools=[add]).specs)
    assert shared_json(first) is None
    assert shared_json(list(first)) is None  # equal is not the same
    assert shared_json(None) is None


def test_the_text_of_a_dropped_rendering_is_never_given_for_a_new_one() -> None:
    """A dropped rendering's memory, and so its id, is soon reused by a new list: its text
    must have gone with it. Rendering after rendering, with the cache always full, each
    text is the JSON of its own rendering."""
    for n in range(4 * _REMEMBER):
        tools = [weather] if n % 2 else [add, weather]
        rendered = render_openai(Toolkit.create(builtins=False, extra_tools=tools).specs)
        text = shared_json(rendered)
        assert text is not None and json.loads(text) == rendered


@define_tool
async def listing() -> str:
    """A directory listing with a name that is not UTF-8 on disk."""
    return "café.txt, " + os.fsdecode(b"caf\xe9.txt")  # PEP 383: a lone surrogate


async def test_a_lone_surrogate_in_a_tool_result_is_sent_escaped() -> None:
    """A file name that is not UTF-8 reaches Python as a lone surrogate; the request
    carries it as a JSON escape (what ensure_ascii would write) instead of failing to
    encode the body."""
    replies = iter(
        [
            {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "listing", "arguments": "{}"},
                                }
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            },
            REPLIES["openai"],
        ]
    )
    transport = MockTransport(lambda request: json_response(next(replies)))
    toolkit = Toolkit.create(builtins=False, extra_tools=[listing])
    async with _client("openai", transport) as client:
        result = await client.run("list", toolkit)
    assert result.status == "done"
    sent = transport.requests[-1].content
    assert isinstance(sent, bytes) and b"\\udce9" in sent and "café".encode() in sent
    (tool_message,) = [m for m in json.loads(sent)["messages"] if m["role"] == "tool"]
    assert tool_message["content"] == "café.txt, " + os.fsdecode(b"caf\xe9.txt")
