"""Real Anthropic replies, as they really come: recorded traffic replayed through a real
:class:`LlmClient` over the fake provider (``tests/recordings/``, see SOURCES.md)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    RetryPolicy,
    StreamDone,
    StreamText,
    Toolkit,
    Usage,
    define_tool,
)
from toolnexus_async._core.messages import unpaired_calls
from toolnexus_async.testing import json_response, sse_response

from .conftest import FakeProvider
from .replay import load, replay, schema

BASIC_STREAM = "anthropic-sdk-python/streaming/fixtures/basic_response.txt"
CACHE = "pydantic-ai/test_anthropic/test_anthropic_cache_real_api.yaml"

# No recording holds a 529; this is the error body Anthropic documents for it.
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


async def test_overloaded_529_is_retried_by_default_streamed_or_not(provider: FakeProvider):
    """Anthropic's 529 ``overloaded_error``, as an HTTP status or as an error event inside a
    stream, is retried by the default policy (here without its waits); the recorded reply
    that follows is the run's answer."""
    provider.script(
        json_response(OVERLOADED, 529),
        load(CACHE)[1].response(),
        sse_response([("message_start", {"type": "message_start", "message": {}}), OVERLOADED]),
        load(BASIC_STREAM)[0].response(),
    )
    client: LlmClient = provider.client("anthropic", retry=RetryPolicy(base_delay=0))
    async with client, Toolkit.create(builtins=False) as toolkit:
        result = await client.run("What is Python?", toolkit)
        async with client.stream("Hi", toolkit) as stream:
            events = [event async for event in stream]
    assert result.status == "done" and result.text.startswith("Python is a beginner-friendly")
    assert [e.text for e in events if e.kind == "text"] == ["Hello", " there", "!"]
    assert len(provider.requests) == 4
    assert json.loads(json.dumps(provider.bodies[0])) == provider.bodies[1]  # sent again as is


CUT_IN_A_TOOL_CALL = "anthropic-sdk-python/streaming/fixtures/incomplete_partial_json_response.txt"


async def test_a_tool_call_cut_by_max_tokens_is_never_run(provider: FakeProvider):
    """``stop_reason: "max_tokens"`` in the middle of a ``tool_use`` block: the run is
    ``incomplete`` (``limit == "max_tokens"``), the cut call is neither run nor kept in the
    transcript (so never sent back as ``input: {}``), and the text before it is kept."""
    made: list[dict[str, Any]] = []

    @define_tool
    async def make_file(filename: str, lines_of_text: list[str]) -> str:
        """Write a file."""
        made.append({"filename": filename, "lines_of_text": lines_of_text})
        return "written"

    replay(provider, CUT_IN_A_TOOL_CALL)
    client: LlmClient = provider.client("anthropic")
    async with client, Toolkit.create(builtins=False, extra_tools=[make_file]) as toolkit:
        async with client.stream("Write a tax guide to taxes.txt", toolkit) as stream:
            events = [event async for event in stream]
    done = events[-1]
    assert isinstance(done, StreamDone)
    run = done.result
    assert (run.status, run.limit) == ("incomplete", "max_tokens")
    assert made == [] and run.tool_calls == ()
    assert [e.kind for e in events if e.kind in ("tool_call", "tool_result")] == []
    last = run.messages[-1]
    assert isinstance(last, AssistantMessage) and last.tool_calls == ()
    assert last.text is not None and last.text.endswith("Let me do that for you now.")
    assert len(provider.requests) == 1
    # Going on from it sends no cut call back.
    assert unpaired_calls(run.messages) == []


async def test_cache_reads_and_writes_are_counted(provider: FakeProvider):
    """``cache_read_input_tokens`` and ``cache_creation_input_tokens`` stay among the prompt
    tokens and are counted apart in ``Usage`` and the metrics (two recorded replies)."""
    replay(provider, CACHE)
    client: LlmClient = provider.client("anthropic", model="claude-sonnet-4-5")
    async with client, Toolkit.create(builtins=False) as toolkit:
        first = await client.run("What is Python?", toolkit)
        second = await client.run("In one sentence?", toolkit)
        text = client.metrics()
    # As recorded: 3 + 0 + 1111 prompt tokens, then 3 + 418 + 1111.
    assert first.usage == Usage(1114, 406, 1520, cache_read_tokens=1111)
    assert second.usage == Usage(1532, 33, 1565, cache_read_tokens=1111, cache_write_tokens=418)
    model = 'model="claude-sonnet-4-5"'  # the configured name labels the metrics
    assert f'toolnexus_llm_tokens_total{{{model},kind="cache_read"}} 2222' in text
    assert f'toolnexus_llm_tokens_total{{{model},kind="cache_write"}} 418' in text


SERVER_TOOL_STREAMS = [
    ("pydantic-ai/test_anthropic/test_anthropic_code_execution_tool_stream.yaml", 0),
    ("pydantic-ai/test_anthropic/test_anthropic_mcp_servers_stream.yaml", 0),
    ("pydantic-ai/test_anthropic/test_anthropic_web_search_tool_stream.yaml", 0),
    ("pydantic-ai/test_anthropic/test_pause_turn_web_search_streaming_vcr.yaml", 1),
    ("pydantic-ai/test_anthropic/test_anthropic_text_parts_ahead_of_built_in_tool_call.yaml", 1),
    ("pydantic-ai/test_anthropic/test_anthropic_text_parts_ahead_of_built_in_tool_call.yaml", 2),
    ("pydantic-ai/test_anthropic/test_anthropic_text_parts_ahead_of_built_in_tool_call.yaml", 3),
]


def recorded_text(body: bytes) -> str:
    """Every text_delta of a recorded stream, joined: what the model wrote."""
    pieces = []
    for line in body.decode().splitlines():
        if line.startswith("data:") and '"text_delta"' in line:
            delta = json.loads(line[len("data:") :])["delta"]
            pieces.append(delta["text"])
    return "".join(pieces)


@pytest.mark.parametrize(("recording", "index"), SERVER_TOOL_STREAMS)
async def test_streams_with_server_tools_decode_like_unstreamed_replies(recording: str, index: int):
    """Server tools (server_tool_use with web search or code execution, mcp_tool_use) and
    their result blocks, and a pause_turn, stream through: their input_json_delta events
    are skipped as the unstreamed codec skips their blocks, the text is the model's, and
    no client tool is called."""
    provider = FakeProvider()
    recorded = load(recording)[index]
    provider.script(recorded.response())
    client: LlmClient = provider.client("anthropic")
    async with client, Toolkit.create(builtins=False) as toolkit:
        async with client.stream("Search, then answer", toolkit) as stream:
            events = [event async for event in stream]
    done = events[-1]
    assert isinstance(done, StreamDone)
    expected = recorded_text(recorded.body)
    assert expected  # every one of these replies has text
    assert (done.result.status, done.result.text) == ("done", expected)
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == expected
    assert done.result.tool_calls == ()


PAUSED = "pydantic-ai/test_anthropic/test_pause_turn_web_search_vcr.yaml"
PAUSED_STREAM = "pydantic-ai/test_anthropic/test_pause_turn_web_search_streaming_vcr.yaml"


async def test_a_paused_turn_is_sent_back_as_it_came_and_continued():
    """``stop_reason: "pause_turn"`` (a long server tool turn): the client sends the paused
    reply back, server tool blocks and all, in their order, and the model goes on: two
    requests, and the run's text is the continuation's. Unstreamed, the follow-up equals
    the request the API accepted when recorded."""
    provider = FakeProvider()
    recorded = replay(provider, PAUSED)
    client: LlmClient = provider.client("anthropic")
    async with client, Toolkit.create(builtins=False) as toolkit:
        result = await client.run(recorded[0].request["messages"][0]["content"], toolkit)
    assert (result.status, result.turns, len(provider.requests)) == ("done", 2, 2)
    assert provider.bodies[1]["messages"][1] == recorded[1].request["messages"][1]
    final = [b["text"] for b in recorded[1].json()["content"] if b["type"] == "text"]
    assert result.text == "".join(final)


async def test_a_paused_streamed_turn_is_sent_back_whole_and_continued():
    """Streamed, the paused reply's blocks are rebuilt from their deltas: the follow-up
    carries them in order, valid by the Messages API's published request schema, with
    the server tools' ids and inputs the recorded client sent back."""
    provider = FakeProvider()
    recorded = replay(provider, PAUSED_STREAM)
    client: LlmClient = provider.client("anthropic")
    async with client, Toolkit.create(builtins=False) as toolkit:
        async with client.stream("What is the weather in SF?", toolkit) as stream:
            events = [event async for event in stream]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.result.status, done.result.turns, len(provider.requests)) == ("done", 2, 2)
    sent = provider.bodies[1]["messages"][1]["content"]
    theirs = recorded[1].request["messages"][1]["content"]
    assert [b["type"] for b in sent] == [b["type"] for b in theirs]
    for mine, recorded_block in zip(sent, theirs, strict=True):
        if mine["type"] == "server_tool_use":
            assert (mine["id"], mine["input"]) == (recorded_block["id"], recorded_block["input"])
        if mine["type"] in ("text", "thinking"):
            assert mine.get("text") == recorded_block.get("text")
            assert mine.get("signature") == recorded_block.get("signature")
    request = {k: v for k, v in provider.bodies[1].items() if k != "stream"}
    validator = jsonschema.Draft202012Validator(schema("anthropic-messages-request-non-streaming"))
    validator.validate(request)
