"""client.stream(): typed events over server-sent events, for both wire styles.

The provider streams over the mock transport (``provider``), its body handed over in pieces
of ``chunk_size`` bytes: one byte at a time cuts every event, a large size delivers several
events in one piece. Loopback stays for leaving early, which must abort a real request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from aiohttp import web

from tests.conftest import FakeLLM, FakeProvider, assert_no_leaks
from toolnexus_async import (
    Answer,
    AssistantMessage,
    HttpResponse,
    LlmClient,
    ProtocolError,
    ProviderError,
    Request,
    RetryPolicy,
    StreamDone,
    StreamEvent,
    StreamPending,
    StreamText,
    StreamToolCall,
    StreamToolResult,
    StreamUsage,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    UsageError,
    define_tool,
)
from toolnexus_async.testing import ScriptedModel, reply, sse_response, tool_call

NO_RETRY = RetryPolicy(retries=0)
# Pieces the streamed body is cut into: every byte apart, a few bytes, all in one.
CHUNK_SIZES = pytest.mark.parametrize("chunk_size", [1, 5, 1 << 16])


def openai_stream(*payloads: Any, done: bool = True) -> HttpResponse:
    """An OpenAI-style event stream, ended by ``[DONE]`` unless ``done`` is false."""
    return sse_response([*payloads, "[DONE]"] if done else payloads)


def text_chunks(*parts: str, usage: bool = True) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = [
        {"model": "m", "choices": [{"index": 0, "delta": {"content": part}}]} for part in parts
    ]
    chunks.append({"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage:
        chunks.append(
            {
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )
    return chunks


def call_chunks(call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    half = len(arguments) // 2
    return [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": arguments[:half]},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]


@define_tool
async def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def collect(client: LlmClient, toolkit: Toolkit, prompt: str = "hi") -> list[StreamEvent]:
    events: list[StreamEvent] = []
    async with client.stream(prompt, toolkit) as stream:
        async for event in stream:
            events.append(event)
    return events


@CHUNK_SIZES
async def test_openai_text_tool_call_and_result_arrive_as_typed_events(
    provider: FakeProvider, chunk_size: int
):
    """Text deltas in order, the tool call with assembled arguments, its result, usage, and
    a final done whose result equals what the deltas said."""

    def handler(body: dict[str, Any], seen: Any) -> Any:
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        if any(m["role"] == "tool" for m in body["messages"]):
            return openai_stream(*text_chunks("It is ", "sunny", " in Oslo."))
        return openai_stream(*call_chunks("c1", "weather", '{"city": "Oslo"}'))

    provider.handler = handler
    provider.chunk_size = chunk_size
    toolkit = Toolkit.create(builtins=False, extra_tools=[weather])
    async with provider.client() as client:
        events = await collect(client, toolkit)

    kinds = [e.kind for e in events]
    assert kinds == [
        "usage",
        "tool_call",
        "tool_result",
        "text",
        "text",
        "text",
        "usage",
        "done",
    ]
    assert events[1] == StreamToolCall("c1", "weather", {"city": "Oslo"})
    assert events[2] == StreamToolResult("c1", "weather", "sunny in Oslo", False)
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "It is sunny in Oslo."
    usage = events[6]
    assert isinstance(usage, StreamUsage) and usage.usage.total_tokens == 5
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.result.status == "done"
    assert done.result.text == "It is sunny in Oslo."
    assert len(provider.requests) == 2
    assert_no_leaks()


@CHUNK_SIZES
async def test_anthropic_stream_events(provider: FakeProvider, chunk_size: int):
    """message_start / content_block_* / message_delta / message_stop become the same events."""

    def block(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, **fields}

    def text_delta(text: str) -> tuple[str, dict[str, Any]]:
        return block("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    events_body = [
        block("message_start", message={"model": "claude", "usage": {"input_tokens": 4}}),
        block("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        text_delta("Hel"),
        text_delta("lo"),
        block("content_block_stop", index=0),
        block("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
        block("message_stop"),
    ]
    provider.handler = lambda b, s: sse_response(events_body)
    provider.chunk_size = chunk_size
    async with provider.client("anthropic", "claude") as client:
        events = await collect(client, Toolkit.create(builtins=False))

    assert [e.kind for e in events] == ["text", "text", "usage", "done"]
    assert provider.bodies[0]["stream"] is True
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.result.text == "Hello"
    assert done.result.usage.total_tokens == 6


async def test_pending_is_emitted_before_wait_for_is_awaited():
    """The consumer sees the request while wait_for is still waiting: wait_for here only
    answers once the consumer has seen the pending event."""
    seen_pending = anyio.Event()

    @define_tool
    async def login(ctx: ToolContext | None = None) -> ToolResult:
        """Needs a login."""
        if ctx is None or ctx.answer is None:
            return ToolResult.auth_required("https://example.com/login")
        return ToolResult.ok("logged in")

    async def wait_for(request: Request) -> Answer:
        await seen_pending.wait()
        return Answer(request.id, True)

    model = ScriptedModel(reply(tool_call("login", id="c1")), "welcome")
    toolkit = Toolkit.create(builtins=False, extra_tools=[login])
    events: list[StreamEvent] = []
    with anyio.fail_after(5):
        async with LlmClient.in_process(model, wait_for=wait_for) as client:
            async with client.stream("go", toolkit) as stream:
                async for event in stream:
                    events.append(event)
                    if isinstance(event, StreamPending):
                        assert event.request.url == "https://example.com/login"
                        seen_pending.set()

    kinds = [e.kind for e in events]
    assert kinds.index("pending") < kinds.index("tool_result")
    assert next(e for e in events if isinstance(e, StreamToolResult)).output == "logged in"
    assert isinstance(events[-1], StreamDone) and events[-1].result.text == "welcome"


async def test_without_wait_for_the_stream_reports_pending_and_ends_halted():
    """No wait_for: a pending event, then done with a halted result."""
    model = ScriptedModel(reply(tool_call("question", {"questions": [{"question": "Why?"}]})))
    async with LlmClient.in_process(model) as client:
        events = await collect(client, Toolkit.create())
    assert [e.kind for e in events] == ["usage", "tool_call", "pending", "done"]
    done = events[-1]
    assert isinstance(done, StreamDone) and done.result.status == "pending"


async def test_a_stream_that_breaks_off_raises_and_never_yields_done(provider: FakeProvider):
    """No [DONE] and no finish_reason: ProtocolError, and no done event before it."""
    streamed = openai_stream(
        {"choices": [{"index": 0, "delta": {"content": "partial"}}]}, done=False
    )
    provider.handler = lambda b, s: streamed
    events: list[StreamEvent] = []
    async with provider.client(retry=NO_RETRY) as client:
        with pytest.raises(ProtocolError, match="ended before"):
            async with client.stream("hi", Toolkit.create(builtins=False)) as stream:
                async for event in stream:
                    events.append(event)
    assert [e.kind for e in events] == ["text"]
    assert_no_leaks()


async def test_a_provider_error_event_raises(provider: FakeProvider):
    """An error chunk mid-stream is a ProviderError; the key is not in it."""
    streamed = openai_stream(
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"error": {"message": "overloaded sk-secret", "code": 503}},
        done=False,
    )
    provider.handler = lambda b, s: streamed
    async with provider.client(api_key="sk-secret", retry=NO_RETRY) as client:
        with pytest.raises(ProviderError) as caught:
            async with client.stream("hi", Toolkit.create(builtins=False)) as stream:
                async for _ in stream:
                    pass
    assert caught.value.status == 503
    assert "sk-secret" not in str(caught.value)
    assert_no_leaks()


async def test_iterating_without_async_with_is_refused():
    """A plain async for could not stop the run if it broke off: a clear error instead,
    and no run was started."""
    model = ScriptedModel("hello there")
    async with LlmClient.in_process(model) as client:
        with pytest.raises(UsageError, match="async with"):
            async for _ in client.stream("hi", Toolkit.create(builtins=False)):
                pass
    assert model.requests == []
    assert_no_leaks()


class HoldingLLM(FakeLLM):
    """Streams one text event, then holds the response open until released."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.closed = threading.Event()
        self.release = threading.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "thinking"}}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.started.set()
        try:
            while not self.release.is_set():
                await asyncio.sleep(0.01)  # the server polls its own release flag
                await response.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.closed.set()
            raise
        return response


@pytest.fixture
def holding_llm() -> Iterator[HoldingLLM]:
    server = HoldingLLM()
    server.start()
    try:
        yield server
    finally:
        server.release.set()
        server.stop()


async def test_leaving_early_aborts_the_http_request(holding_llm: HoldingLLM):
    """Breaking out of `async with client.stream(...)` closes the connection mid-stream."""
    with anyio.fail_after(5):
        async with LlmClient(holding_llm.url, model="m", api_key="sk-test-key") as client:
            async with client.stream("hi", Toolkit.create(builtins=False)) as stream:
                async for event in stream:
                    assert event == StreamText("thinking")
                    break
            assert await anyio.to_thread.run_sync(holding_llm.closed.wait, 5)
    assert_no_leaks()


async def test_leaving_early_cancels_the_tool_tasks():
    """Tools still running when the consumer leaves are cancelled, not left behind."""
    cancelled: list[str] = []
    started = anyio.Event()

    @define_tool
    async def slow(n: int) -> str:
        """Takes forever."""
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(f"slow {n}")
            raise
        return "never"

    model = ScriptedModel(reply(tool_call("slow", {"n": 1}), tool_call("slow", {"n": 2})))
    toolkit = Toolkit.create(builtins=False, extra_tools=[slow])
    with anyio.fail_after(5):
        async with LlmClient.in_process(model) as client:
            async with client.stream("go", toolkit) as stream:
                async for event in stream:
                    if event.kind == "tool_call":
                        await started.wait()
                        break
    assert sorted(cancelled) == ["slow 1", "slow 2"]
    assert_no_leaks()


async def test_a_tool_result_says_whether_its_request_was_declined():
    """``StreamToolResult.declined``: from how the request was answered, not from the text."""

    @define_tool
    async def pay(amount: int, ctx: ToolContext | None = None) -> ToolResult:
        """Pay, once approved."""
        if ctx is None or ctx.answer is None:
            return ToolResult.pending(Request("", "approval", f"Pay {amount}?"))
        return ToolResult.ok("declined/expired: looks refused, but was paid")

    def model(messages: list[Any], tools: list[Any]) -> Any:
        if any(getattr(m, "role", None) == "tool" for m in messages):
            return "ok"
        return AssistantMessage(None, (ToolCall("c1", "pay", {"amount": 5}),))

    seen: dict[bool, StreamToolResult] = {}
    for ok in (True, False):

        async def answer(request: Request, ok: bool = ok) -> Answer:
            return Answer(request.id, ok)

        async with (
            Toolkit.create(builtins=False, extra_tools=[pay]) as toolkit,
            LlmClient.in_process(model, wait_for=answer) as client,
            client.stream("pay", toolkit) as events,
        ):
            async for event in events:
                if isinstance(event, StreamToolResult):
                    seen[ok] = event
    assert seen[True].declined is False  # paid, whatever its text says
    assert seen[False].declined is True and seen[False].is_error
    assert_no_leaks()
