"""Reasoning, as real providers send it: Anthropic's ``thinking`` and ``redacted_thinking``
blocks, which must go back unchanged in the follow-up request, and the ``reasoning`` of
OpenAI-compatible servers, replayed through a real :class:`LlmClient` over the fake
provider (``tests/recordings/``)."""

from __future__ import annotations

import json
from typing import Any

from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    Reasoning,
    RunResult,
    StreamDone,
    StreamReasoning,
    StreamText,
    Toolkit,
    UserMessage,
    define_tool,
    messages_from_json,
    messages_to_json,
)
from toolnexus_async._core.codecs.openai import OpenAICodec

from .conftest import FakeProvider
from .replay import load, replay

THINKING_WITH_TOOL = "pydantic-ai/test_anthropic/test_anthropic_tool_with_thinking.yaml"
REDACTED = "pydantic-ai/test_anthropic/test_anthropic_model_thinking_part_redacted.yaml"
THINKING_STREAM = "pydantic-ai/test_anthropic/test_anthropic_model_thinking_part_stream.yaml"
REDACTED_STREAM = (
    "pydantic-ai/test_anthropic/test_anthropic_model_thinking_part_redacted_stream.yaml"
)
ANY_REPLY = "pydantic-ai/test_anthropic/test_anthropic_cache_real_api.yaml"


@define_tool
async def get_user_country() -> str:
    """Get the user's country."""
    return "Mexico"


async def test_thinking_goes_back_unchanged_before_the_tool_use():
    """The follow-up after a tool call carries the assistant's thinking block, with its
    signature, first: exactly the assistant message the API accepted when recorded."""
    provider = FakeProvider()
    recorded = replay(provider, THINKING_WITH_TOOL)
    client: LlmClient = provider.client("anthropic", model="claude-sonnet-4-0")
    async with client, Toolkit.create(builtins=False, extra_tools=[get_user_country]) as tk:
        result = await client.run("What is the largest city in the user country?", tk)
    assert result.status == "done" and "Mexico City" in result.text
    assert provider.bodies[1]["messages"][1] == recorded[1].request["messages"][1]
    (thought,) = result.messages[1].reasoning  # type: ignore[union-attr]
    assert thought.signature and thought.text.startswith("The user is asking")


async def test_redacted_thinking_goes_back_unchanged():
    """A ``redacted_thinking`` block (opaque data) goes back as it came, in a later turn."""
    provider = FakeProvider()
    recorded = replay(provider, REDACTED)
    first_prompt = recorded[0].request["messages"][0]["content"][0]["text"]
    client: LlmClient = provider.client("anthropic", model="claude-sonnet-4-5-20250929")
    async with client, Toolkit.create(builtins=False) as toolkit:
        first = await client.run(first_prompt, toolkit)
        await client.run("What was that?", toolkit, history=first.messages)
    assert provider.bodies[1]["messages"][1] == recorded[1].request["messages"][1]


def recorded_thinking(body: bytes) -> list[dict[str, Any]]:
    """The thinking blocks of a recorded stream, as the API wants them back."""
    blocks: dict[int, dict[str, Any]] = {}
    for line in body.decode().splitlines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line[len("data:") :])
        if event["type"] == "content_block_start":
            block = event["content_block"]
            if block["type"] == "redacted_thinking":
                blocks[event["index"]] = {"type": "redacted_thinking", "data": block["data"]}
            elif block["type"] == "thinking":
                blocks[event["index"]] = {"type": "thinking", "thinking": "", "signature": ""}
        elif event["type"] == "content_block_delta" and event["index"] in blocks:
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] += delta["signature"]
    return [blocks[index] for index in sorted(blocks)]


async def test_streamed_thinking_goes_back_unchanged():
    """Streamed, thinking arrives as thinking_delta and signature_delta pieces (a redacted
    block whole at its start); the follow-up sends the blocks back as they were."""
    for recording in (THINKING_STREAM, REDACTED_STREAM):
        provider = FakeProvider()
        (streamed,) = load(recording)
        provider.script(streamed.response(), load(ANY_REPLY)[1].response())
        client: LlmClient = provider.client("anthropic")
        async with client, Toolkit.create(builtins=False) as toolkit:
            async with client.stream("Think first", toolkit) as events:
                done = [event async for event in events][-1]
            assert isinstance(done, StreamDone)
            await client.run("And then?", toolkit, history=done.result.messages)
        expected = recorded_thinking(streamed.body)
        assert expected
        sent = provider.bodies[1]["messages"][1]["content"]
        assert sent[: len(expected)] == expected
        assert sent[len(expected)]["type"] == "text"


async def test_reasoning_survives_json_and_is_dropped_for_another_style():
    """The transcript keeps reasoning in its JSON form (version 2) and in a stored run; the
    openai style does not send another style's reasoning; a version 1 transcript loads."""
    provider = FakeProvider()
    replay(provider, THINKING_WITH_TOOL)
    client: LlmClient = provider.client("anthropic", model="claude-sonnet-4-0")
    async with client, Toolkit.create(builtins=False, extra_tools=[get_user_country]) as tk:
        result = await client.run("What is the largest city in the user country?", tk)
    stored = json.loads(json.dumps(messages_to_json(result.messages)))
    assert stored["version"] == 2
    assert messages_from_json(stored) == list(result.messages)
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    body = OpenAICodec().encode(result.messages, [], model="m", max_tokens=None)
    assert "thinking" not in json.dumps(body) and "signature" not in json.dumps(body)
    old = {"version": 1, "messages": [{"role": "user", "text": "hi"}]}
    assert messages_from_json(old) == [UserMessage("hi")]
    assert AssistantMessage("x", reasoning=(Reasoning("t", "s"),)).reasoning[0].style == (
        "anthropic"
    )


GROQ = "pydantic-ai/test_groq/test_tool_use_failed_error.yaml"
GROQ_STREAM = "pydantic-ai/test_groq/test_tool_use_failed_error_streaming.yaml"


@define_tool
async def get_something_by_name(name: str) -> str:
    """Get something by name."""
    return f"Something with name: {name}"


def reasoning_in(messages: Any) -> list[Reasoning]:
    return [r for m in messages if isinstance(m, AssistantMessage) for r in m.reasoning]


async def test_reasoning_is_streamed_as_its_own_events_and_kept_per_turn():
    """The ``reasoning`` of an OpenAI-compatible server (Groq's ``delta.reasoning``) and
    Anthropic's thinking stream as ``reasoning`` events, never as text; each turn's
    reasoning is kept in its assistant message."""
    for recording, style, replies in (
        (GROQ_STREAM, "openai", slice(1, None)),
        (THINKING_STREAM, "anthropic", slice(0, 1)),
    ):
        provider = FakeProvider()
        provider.script(*(r.response() for r in load(recording)[replies]))
        client: LlmClient = provider.client(style)
        tools = Toolkit.create(builtins=False, extra_tools=[get_something_by_name])
        async with client, tools as toolkit:
            async with client.stream("Look up something", toolkit) as stream:
                events = [event async for event in stream]
        done = events[-1]
        assert isinstance(done, StreamDone)
        kept = reasoning_in(done.result.messages)
        assert kept and all(r.text and r.style == style for r in kept)
        streamed = "".join(e.text for e in events if isinstance(e, StreamReasoning))
        assert streamed == "".join(r.text for r in kept)
        text = "".join(e.text for e in events if isinstance(e, StreamText))
        assert not any(r.text in text for r in kept)


async def test_openai_style_reasoning_is_kept_and_not_sent_back():
    """Unstreamed, Groq's ``message.reasoning`` is kept per turn; the follow-up does not
    carry it (the servers do not ask for it back)."""
    provider = FakeProvider()
    replies = load(GROQ)[1:]
    provider.script(*(r.response() for r in replies))
    client: LlmClient = provider.client()
    async with client, Toolkit.create(builtins=False, extra_tools=[get_something_by_name]) as tk:
        result = await client.run("Look up something", tk)
    kept = reasoning_in(result.messages)
    assert [r.text for r in kept] == [
        r.json()["choices"][0]["message"]["reasoning"] for r in replies
    ]
    assert all(r.style == "openai" for r in kept)
    assert "reasoning" not in json.dumps(provider.bodies[1]["messages"])
