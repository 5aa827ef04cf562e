"""Real OpenAI-style providers, as they really answer: recorded replies replayed through a
real :class:`LlmClient` over the fake provider (``tests/recordings/``, see SOURCES.md)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    ModelSettings,
    ProviderError,
    RunResult,
    StreamDone,
    Toolkit,
    Usage,
    define_tool,
)

from .conftest import FakeProvider
from .replay import load, replay, schema
from .shared import run_or_stream

GEMINI_WITHOUT_ID = "pydantic-ai/test_openai/test_compatible_api_with_tool_calls_without_id.yaml"
HF_MAX_TOKENS = "pydantic-ai/test_huggingface/test_max_completion_tokens.yaml"
GROQ_TOOL_USE_FAILED = "pydantic-ai/test_groq/test_tool_use_failed_error.yaml"
GROQ_TOOL_USE_FAILED_STREAM = "pydantic-ai/test_groq/test_tool_use_failed_error_streaming.yaml"


@define_tool
async def get_current_time() -> str:
    """Get the current time."""
    return "Noon"


def clock() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[get_current_time])


async def run_gemini(provider: FakeProvider) -> tuple[str, str, list[str]]:
    replay(provider, GEMINI_WITHOUT_ID)
    client: LlmClient = provider.client(model="gemini-2.5-pro-preview-05-06")
    async with client, clock() as toolkit:
        result = await client.run("What is the current time?", toolkit)
    assert (result.status, result.text) == ("done", "The current time is Noon.")
    (record,) = result.tool_calls
    follow_up = provider.bodies[-1]["messages"]
    sent_ids = [follow_up[1]["tool_calls"][0]["id"], follow_up[2]["tool_call_id"]]
    return record.id, record.result.output, sent_ids


async def test_gemini_tool_call_with_an_empty_id_gets_a_stable_id(provider: FakeProvider):
    """Gemini's OpenAI-compatible endpoint sends ``"id": ""``: the call runs under an id
    derived from the reply, and its result goes back paired with that same id."""
    call_id, output, sent_ids = await run_gemini(provider)
    assert call_id.startswith("call_") and len(call_id) > len("call_")
    assert output == "Noon"
    assert sent_ids == [call_id, call_id]
    # Deterministic: the same recorded reply gives the same id in another run.
    again = FakeProvider()
    assert (await run_gemini(again))[0] == call_id


@define_tool
async def get_something_by_name(name: str) -> str:
    """Get something by name."""
    return f"something called {name}"


async def groq_failure(provider: FakeProvider, recording: str, *, stream: bool) -> ProviderError:
    replay(provider, recording)  # the first reply is the failure; the others must not be asked
    client: LlmClient = provider.client(model="openai/gpt-oss-120b")
    async with (
        client,
        Toolkit.create(builtins=False, extra_tools=[get_something_by_name]) as toolkit,
    ):
        with pytest.raises(ProviderError) as caught:
            await run_or_stream(client, stream, "Look up something", toolkit)
    assert len(provider.requests) == 1, "a 400 is not retried"
    return caught.value


async def test_groq_error_event_inside_a_stream_has_the_status_it_names():
    """Groq's ``tool_use_failed`` error event, inside a 200 stream, carries
    ``"status_code": 400``: a ProviderError(400), not retried, like the non-streamed twin
    (an HTTP 400 reply)."""
    streamed = await groq_failure(FakeProvider(), GROQ_TOOL_USE_FAILED_STREAM, stream=True)
    unstreamed = await groq_failure(FakeProvider(), GROQ_TOOL_USE_FAILED, stream=False)
    assert streamed.status == unstreamed.status == 400
    for error in (streamed, unstreamed):
        assert "tool_use_failed" in error.body
        assert "Tool call validation failed" in error.body


def deprecated_fields(body: dict[str, Any]) -> list[str]:
    """The keys of ``body`` that OpenAI's published request schema marks deprecated."""
    request = schema("openai-chat-completions-request")
    fields: dict[str, Any] = {}
    for part in request["components"]["schemas"]["CreateChatCompletionRequest"]["allOf"]:
        if "$ref" in part:
            part = request["components"]["schemas"][part["$ref"].rsplit("/", 1)[-1]]
        fields.update(part.get("properties", {}))
    return [key for key in body if fields.get(key, {}).get("deprecated")]


async def test_max_tokens_is_sent_as_max_completion_tokens(provider: FakeProvider):
    """``ModelSettings(max_tokens=...)`` sends ``max_completion_tokens``: a request valid by
    OpenAI's published schema, and free of the fields it marks deprecated."""
    replay(provider, HF_MAX_TOKENS)
    client: LlmClient = provider.client(settings=ModelSettings(max_tokens=100))
    async with client, Toolkit.create(builtins=False) as toolkit:
        await client.run("hello", toolkit)
    (body,) = provider.bodies
    assert body["max_completion_tokens"] == 100 and "max_tokens" not in body
    jsonschema.Draft202012Validator(schema("openai-chat-completions-request")).validate(body)
    assert deprecated_fields(body) == []


async def test_max_tokens_field_sends_the_old_name_to_servers_that_know_only_it(
    provider: FakeProvider,
):
    """``max_tokens_field="max_tokens"`` sends the request the recorded client sent to a
    Hugging Face router, which answers it."""
    (recorded,) = replay(provider, HF_MAX_TOKENS)
    client: LlmClient = provider.client(
        model="deepseek-ai/DeepSeek-R1",
        settings=ModelSettings(max_tokens=100, max_tokens_field="max_tokens"),
    )
    async with client, Toolkit.create(builtins=False) as toolkit:
        result = await client.run("hello", toolkit)
    (body,) = provider.bodies
    assert {k: body[k] for k in ("model", "max_tokens", "messages")} == {
        k: recorded.request[k] for k in ("model", "max_tokens", "messages")
    }
    assert "max_completion_tokens" not in body
    assert result.text.startswith("<think>")


REFUSAL = "openai-python/chat_completions/test_parse_pydantic_model_refusal.json"
REFUSAL_STREAM = "openai-python/chat_completions_stream/test_parse_pydantic_model_refusal.sse"
# What the model said in each recording.
REFUSED = "I'm very sorry, but I can't assist with that."
REFUSED_STREAMED = "I'm sorry, I can't assist with that request."


async def test_a_refusal_is_carried_by_the_run_streamed_or_not(provider: FakeProvider):
    """OpenAI's ``message.refusal`` (and its streamed ``delta.refusal`` pieces) is the run's
    ``refusal``, with an empty text, in the transcript and its JSON form too."""
    replay(provider, REFUSAL)
    client: LlmClient = provider.client(model="gpt-4o-2024-08-06")
    async with client, Toolkit.create(builtins=False) as toolkit:
        result = await client.run("What's the weather like in San Francisco?", toolkit)
    streamed_provider = FakeProvider()
    replay(streamed_provider, REFUSAL_STREAM)
    streaming: LlmClient = streamed_provider.client(model="gpt-4o-2024-08-06")
    async with streaming, Toolkit.create(builtins=False) as toolkit:
        async with streaming.stream("What's the weather like?", toolkit) as events:
            done = [event async for event in events][-1]
    assert isinstance(done, StreamDone)
    streamed = done.result
    for run, said in ((result, REFUSED), (streamed, REFUSED_STREAMED)):
        assert (run.status, run.text, run.refusal) == ("done", "", said)
        assert run.messages[-1] == AssistantMessage(None, (), said)
        assert RunResult.from_dict(json.loads(json.dumps(run.to_dict()))) == run
        stored_before = {k: v for k, v in run.to_dict().items() if k != "refusal"}
        assert RunResult.from_dict(stored_before).refusal is None  # a run stored before
    # Sent back as the refusal it was, in a follow-up.
    follow_up = FakeProvider()
    replay(follow_up, REFUSAL)
    async with follow_up.client() as again, Toolkit.create(builtins=False) as toolkit:
        await again.run("Why not?", toolkit, history=result.messages)
    assert follow_up.bodies[0]["messages"][1] == {
        "role": "assistant",
        "content": None,
        "refusal": REFUSED,
    }


MAX_TOKENS_REACHED = "openai-python/chat_completions/test_parse_max_tokens_reached.json"
MAX_TOKENS_REACHED_STREAM = (
    "openai-python/chat_completions_stream/test_parse_max_tokens_reached.sse"
)


async def test_a_reply_cut_by_the_output_limit_ends_the_run_incomplete():
    """``finish_reason: "length"``: the run is ``incomplete`` with ``limit == "max_tokens"``
    and keeps the text written before the cut, streamed or not."""
    runs = []
    for recording, stream in ((MAX_TOKENS_REACHED, False), (MAX_TOKENS_REACHED_STREAM, True)):
        provider = FakeProvider()
        replay(provider, recording)
        client: LlmClient = provider.client(settings=ModelSettings(max_tokens=1))
        async with client, clock() as toolkit:
            if stream:
                async with client.stream("What's the weather like in SF?", toolkit) as events:
                    done = [event async for event in events][-1]
                assert isinstance(done, StreamDone)
                runs.append(done.result)
            else:
                runs.append(await client.run("What's the weather like in SF?", toolkit))
    for run in runs:
        assert (run.status, run.limit, run.turns) == ("incomplete", "max_tokens", 1)
        assert run.text == '{"'  # what the model wrote before the cut
        assert run.tool_calls == ()


async def test_cached_and_reasoning_tokens_are_counted_streamed_or_not():
    """``prompt_tokens_details.cached_tokens`` and ``completion_tokens_details
    .reasoning_tokens`` reach ``Usage`` and the metrics, streamed or not (Groq's two
    successful turns after its failed one, as recorded)."""
    usages, texts = [], []
    for recording, stream in ((GROQ_TOOL_USE_FAILED, False), (GROQ_TOOL_USE_FAILED_STREAM, True)):
        provider = FakeProvider()
        provider.script(*(r.response() for r in load(recording)[1:]))
        client: LlmClient = provider.client(model="openai/gpt-oss-120b")
        async with (
            client,
            Toolkit.create(builtins=False, extra_tools=[get_something_by_name]) as toolkit,
        ):
            if stream:
                async with client.stream("Look up something", toolkit) as events:
                    done = [event async for event in events][-1]
                assert isinstance(done, StreamDone)
                run = done.result
            else:
                run = await client.run("Look up something", toolkit)
            texts.append(client.metrics())
        assert (run.status, run.turns) == ("done", 2)
        usages.append(run.usage)
    unstreamed, streamed = usages
    # As recorded: 301 + 336 prompt tokens, 256 of them cached; 52 + 96 completion tokens,
    # 22 + 59 of them reasoning.
    assert unstreamed == Usage(637, 148, 785, cache_read_tokens=256, reasoning_tokens=81)
    # Streamed: 304 + 339 prompt, 49 + 58 completion, 23 + 38 reasoning, nothing cached.
    assert streamed == Usage(643, 107, 750, reasoning_tokens=61)
    model = 'model="openai/gpt-oss-120b"'
    assert f'toolnexus_llm_tokens_total{{{model},kind="cache_read"}} 256' in texts[0]
    assert f'toolnexus_llm_tokens_total{{{model},kind="reasoning"}} 81' in texts[0]
    assert f'toolnexus_llm_tokens_total{{{model},kind="reasoning"}} 61' in texts[1]
    assert 'kind="cache_read"' not in texts[1]  # only kinds a provider reported
    assert RunResult.from_dict(json.loads(json.dumps(run.to_dict()))).usage == streamed


async def test_streamed_tool_call_arguments_go_back_verbatim():
    """The arguments of a streamed call go back in the follow-up as the model wrote them
    (Groq's compact ``{"name":"example"}``), not re-encoded, as unstreamed ones do."""
    for recording, stream in ((GROQ_TOOL_USE_FAILED_STREAM, True), (GROQ_TOOL_USE_FAILED, False)):
        provider = FakeProvider()
        replies = load(recording)[1:]
        provider.script(*(r.response() for r in replies))
        client: LlmClient = provider.client(model="openai/gpt-oss-120b")
        async with (
            client,
            Toolkit.create(builtins=False, extra_tools=[get_something_by_name]) as toolkit,
        ):
            if stream:
                async with client.stream("Look up something", toolkit) as events:
                    async for _ in events:
                        pass
            else:
                await client.run("Look up something", toolkit)
        sent = provider.bodies[1]["messages"][1]["tool_calls"][0]["function"]["arguments"]
        wrote = '{"name":"example"}' if stream else '{"name":"test"}'  # as recorded
        assert sent == wrote
